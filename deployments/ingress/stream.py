"""Stream: the connection's view of one session (its lifecycle, identity, chunk counter, journal).

The replicas key a session by a routing key unique per *incarnation* (client id + random
suffix, deployments/wire.py): two connections that pick the same `session_id`, or a session
restarted under the same id, never share server-side state, and releasing an old incarnation
cannot touch the new one. A session rebuilt on another replica after a failure (recovery) gets
a fresh routing key on that deployment (`dit_key`, `vae_key`), so stale pins and late calls of
the lost incarnation cannot reach it.
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Optional

import numpy as np

from camera import DEFAULT_INTRINSICS_RESOLUTION, planned_latent_frames
from deployments.ingress.detached import retrieved
from deployments.ingress.journal import SessionJournal
from deployments.replicas.snapshots import snapshot_id
from deployments.wire import SessionOptions, owner_tag, routing_key
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import FrameReply, InferRequest

DEFAULT_SEED = 42  # the reference's base_seed


class StreamState(Enum):
    OPEN = auto()  # chunks may be dispatched; the replicas hold (or are opening) the session
    FAILED = auto()  # the server lost or refused it and released it; restarting needs image + prompt
    CLOSED = auto()  # released on purpose (reset, replaced by a new session, connection end)


class StreamClosed(RuntimeError):
    """An illegal lifecycle transition (a bug in the connection logic)."""


def new_routing_key(spec: SessionOptions) -> str:
    """`<session_id>~<owner>.<random>`: a routing key, the replicas' key of one incarnation of a
    session (deployments/wire.py)."""
    return routing_key(spec.session_id, spec.owner)


def image_digest(image: bytes | np.ndarray) -> str:
    """Identity of a session's image as sent (bytes, or raw array with its shape)."""
    h = hashlib.sha256()
    if isinstance(image, np.ndarray):
        h.update(repr((image.dtype.str, image.shape)).encode())
        h.update(np.ascontiguousarray(image).tobytes())
    else:
        h.update(image)
    return h.hexdigest()


@dataclass(slots=True)
class ReplicaOpens:
    """The opens of a stream's session on the replicas: each lane's (None: nothing to wait for)
    and the DiT's admission, ahead of any work (lane_jobs.py; made by whichever job asks first)."""

    dit: Optional[asyncio.Future] = None  # result of the DiT open (carries busy)
    vae: Optional[asyncio.Future] = None
    admitted: Optional[asyncio.Future] = None


@dataclass(eq=False, slots=True, weakref_slot=True)
class Stream:
    """One session incarnation on one connection: its identity (options, routing keys), its
    lifecycle (state, the opens on the replicas, the chunks in flight), `next_chunk`, the prompt
    it attends to and its journal. Only this module assigns its fields; the parts that keep
    more per session (resume.py, prefix/reuse.py, drive/) keep it in their own records, keyed
    by the stream (weakly: a record ends with its stream)."""

    spec: SessionOptions
    journal: SessionJournal
    image: np.ndarray  # RGB uint8 [H0, W0, 3]: an implicit reset that changes only the prompt reuses it
    next_chunk: int = 0
    prompt: Optional[str] = None  # the prompt the session attends to now (None: the spec's, after prompt updates)
    key: str = field(init=False)  # the stream's identity on the connection (its first routing key)
    dit_key: str = field(init=False)  # the session's routing key on the DiT deployment (new after a recovery)
    vae_key: str = field(init=False)  # ... and on the VAE deployment
    state: StreamState = field(init=False, default=StreamState.OPEN)
    chunk_tasks: list[asyncio.Task] = field(init=False, default_factory=list)
    # None while no replica holds the session (the prefix store served it so far: `materialised`)
    opens: Optional[ReplicaOpens] = field(init=False, default_factory=ReplicaOpens)
    release: Optional[asyncio.Task] = field(init=False, default=None)  # frees the replicas' state once it ended

    def __post_init__(self) -> None:
        self.key = self.dit_key = self.vae_key = new_routing_key(self.spec)
        if self.prompt is None:
            self.prompt = self.spec.prompt

    @classmethod
    def resumed(cls, spec: SessionOptions, journal: SessionJournal, image: np.ndarray, keys: tuple[str, str, str],
                next_chunk: int, prompt: str) -> "Stream":
        """A parked session's stream (resume.py): its keys (identity, DiT, VAE), opened already."""
        stream = cls(spec, journal, image, next_chunk, prompt)
        stream.key, stream.dit_key, stream.vae_key = keys
        stream.opens = ReplicaOpens(_done(), _done())
        return stream

    def same_image(self, image: bytes | np.ndarray) -> bool:
        """`image` (as sent) is the session's."""
        return image_digest(image) == self.spec.image_digest

    def holds(self, session_id: str, image: bytes | np.ndarray) -> bool:
        """An infer of `session_id` with `image` continues this open session with its own image."""
        return self.state is StreamState.OPEN and self.spec.session_id == session_id and self.same_image(image)

    # ---- the replicas' side ----

    @property
    def materialised(self) -> bool:
        """The replicas hold (or are opening) the session; False while the prefix store served it."""
        return self.opens is not None

    @property
    def dit_open(self) -> Optional[asyncio.Future]:
        return None if self.opens is None else self.opens.dit

    @property
    def vae_open(self) -> Optional[asyncio.Future]:
        return None if self.opens is None else self.opens.vae

    @property
    def dit_admitted(self) -> Optional[asyncio.Future]:
        return None if self.opens is None else self.opens.admitted

    def served_from_store(self) -> None:
        """No replica holds the session yet: the prefix store serves it (prefix/reuse.py)."""
        self.opens = None

    def opening(self, vae: asyncio.Future, dit: asyncio.Future) -> None:
        """The session is being opened (or made again) on the replicas by these lane jobs; the
        DiT's admission, once given, stays."""
        admitted = None if self.opens is None else self.opens.admitted
        self.opens = ReplicaOpens(dit, vae, admitted)

    def reopened(self, lane: str) -> None:
        """A rebuild (recovery.py) made the session again on `lane` ("dit" / "vae"): its open
        there is superseded."""
        assert self.opens is not None, "a rebuild of a session no replica holds"
        if lane == "dit":
            self.opens.dit = _done()
        else:
            self.opens.vae = _done()

    def dit_admission(self) -> asyncio.Future:
        """The DiT's admission future (made by whichever of the stream's jobs asks first)."""
        assert self.opens is not None, "admission of a session no replica holds"
        if self.opens.admitted is None:
            self.opens.admitted = asyncio.get_running_loop().create_future()
            self.opens.admitted.add_done_callback(retrieved)
        return self.opens.admitted

    def new_key(self, lane: str) -> str:
        """A fresh routing key on `lane` ("dit" / "vae"): the session is made again there (a
        rebuild, a copy that failed: the old key stays pinned where it was)."""
        key = new_routing_key(self.spec)
        if lane == "dit":
            self.dit_key = key
        else:
            self.vae_key = key
        return key

    # ---- its chunks ----

    def steer(self, chunk_id: int, prompt: str) -> None:
        """Chunk `chunk_id` and the later ones attend to `prompt` (a prompt update)."""
        self.prompt = prompt
        self.journal.steer(chunk_id, prompt)  # a rewind or fork before it knows the prompt

    def rewind_to(self, k: int) -> tuple[str, str]:
        """The stream becomes its state after k chunks under new routing keys (branching.py: no
        chunk in flight); the old (DiT, VAE) keys."""
        self.journal.truncate(k)
        self.next_chunk = k
        self.prompt = self.journal.prompt_after(k, self.spec.prompt)
        self.chunk_tasks = [t for t in self.chunk_tasks  # all done (no chunk in flight)
                            if isinstance(t.result(), FrameReply) and t.result().chunk_id < k]
        old = self.dit_key, self.vae_key
        self.dit_key, self.vae_key = new_routing_key(self.spec), new_routing_key(self.spec)
        return old

    def snapshot_ids(self, chunks: int) -> tuple[str, str]:
        """(DiT, VAE) snapshot ids of the session's state after `chunks` chunks: inherited (the
        journal's), else its own keys' (a replica that keeps none of them answers `NoSnapshot`)."""
        inherited = self.journal.snapshots.get(chunks)
        if inherited is not None:
            return inherited
        return snapshot_id(self.dit_key, chunks), snapshot_id(self.vae_key, chunks)

    def inherit_snapshots(self, source: "Stream", chunks: int) -> None:
        """This session's first `chunks` chunks are `source`'s (a copy, a rewind's new keys): so
        are their snapshots."""
        self.journal.inherit_snapshots({k: source.snapshot_ids(k) for k in range(1, chunks + 1)})

    # ---- lifecycle ----

    def take_chunk_id(self) -> int:
        if self.state is not StreamState.OPEN:
            raise StreamClosed(f"session {self.spec.session_id} is {self.state.name}; open a new one")
        chunk, self.next_chunk = self.next_chunk, self.next_chunk + 1
        return chunk

    def fail(self) -> bool:
        """OPEN -> FAILED; True when this call made the transition (the caller releases)."""
        if self.state is StreamState.OPEN:
            self.state = StreamState.FAILED
            return True
        return False

    def close(self) -> bool:
        """OPEN/FAILED -> CLOSED; True when the replicas still need a release (was OPEN)."""
        if self.state is StreamState.CLOSED:
            raise StreamClosed(f"session {self.spec.session_id} is already closed")
        was_open = self.state is StreamState.OPEN
        self.state = StreamState.CLOSED
        return was_open

    def released_by(self, task: asyncio.Task) -> asyncio.Task:
        """The task that frees the ended stream on the replicas (releases.py)."""
        self.release = task
        return task


def _done() -> asyncio.Future:
    """A resolved future: an open that is over (a resumed session's, one a rebuild superseded)."""
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


def session_options(req: InferRequest, resolution: tuple[int, int], prompt: str, digest: str,
                    raw_frames: bool = False, principal: str = "", offline: bool = False) -> SessionOptions:
    """The session options of a first infer at output `resolution`; ProtocolError for
    unusable values. `prompt` and `digest` (of the image) are the request's, or on an implicit
    reset that changes one of them, the replaced session's other one; `principal`: the
    connection's (prefix/reuse.py `scope_of`), whose tag is the session's owner (wire.py);
    `raw_frames`, `offline`: the transport's (transport.py `session_traits`)."""
    try:
        total = planned_latent_frames(req.num_frames)
    except ValueError as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
    return SessionOptions(
        session_id=req.session_id, prompt=prompt, image_digest=digest,
        resolution=resolution, seed=DEFAULT_SEED if req.seed is None else req.seed,
        total_latent_frames=total, translation_scale=req.translation_scale,
        intrinsics_resolution=tuple(req.intrinsics_resolution or DEFAULT_INTRINSICS_RESOLUTION),
        raw_frames=raw_frames, owner=owner_tag(principal) if principal else "", offline=offline,
    )
