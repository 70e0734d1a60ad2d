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
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Optional

import numpy as np

from camera import DEFAULT_INTRINSICS_RESOLUTION, planned_latent_frames
from deployments.ingress.journal import SessionJournal
from deployments.ingress.prefix.keys import PrefixCursor
from deployments.replicas.snapshots import snapshot_id
from deployments.wire import SessionOptions, owner_tag, routing_key
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import InferRequest

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
class BoundChunk:
    """A driven chunk on the DiT, bound to the keys held when it started (drive/binding.py)."""

    chunk_id: int
    keys: tuple[str, ...]
    preemptible: bool  # it may be given up for newer keys (once: a chunk made again is not)
    asked: bool = False  # its preempt was sent


@dataclass(eq=False, slots=True)
class Stream:
    """One session incarnation on one connection."""

    spec: SessionOptions
    journal: SessionJournal
    image: np.ndarray  # RGB uint8 [H0, W0, 3]: an implicit reset that changes only the prompt reuses it
    key: str = field(init=False)  # the stream's identity on the connection (its first routing key)
    dit_key: str = field(init=False)  # the session's routing key on the DiT deployment (new after a recovery)
    vae_key: str = field(init=False)  # ... and on the VAE deployment
    state: StreamState = StreamState.OPEN
    next_chunk: int = 0
    chunk_tasks: list[asyncio.Task] = field(default_factory=list)
    dit_open: Optional[asyncio.Future] = None  # result of the DiT open (carries busy)
    dit_admitted: Optional[asyncio.Future] = None  # the DiT's admission, ahead of any work (lane_jobs.py)
    vae_open: Optional[asyncio.Future] = None
    text_encode_s: float = 0.0
    recoveries: int = 0  # times the session was rebuilt on another replica
    driven: bool = False  # opened by `drive`: the server starts its chunks (drive/driver.py), not infers
    bound: Optional[BoundChunk] = None  # its driven chunk the DiT runs now, bound to the keys (drive/binding.py)
    release: Optional[asyncio.Task] = None  # frees the replicas' state once the stream ended
    prompt: str = field(init=False)  # the prompt the session attends to now (after prompt updates)
    # Resume (resume.py): the token its chunk-0 reply carries (None when the server does not
    # resume sessions, and on a stream resumed from the parking), its digest (the parking's
    # key), whether the client has it
    resume_token: Optional[str] = None
    resume_digest: Optional[str] = None
    token_delivered: bool = False
    sent_chunks: int = 0  # chunk replies sent on this socket (chunk ids below it)
    replay: deque = field(default_factory=lambda: deque(maxlen=0))  # the last sent FrameReplies, kept to send again
    pending_replays: deque = field(default_factory=deque)  # replies a resume sends again, not yet sent
    # The prefix store (deployments/ingress/prefix/): the session's path through it (None: it
    # neither reads nor writes it), and whether the replicas hold it (opened, restored). A
    # session served from the store is materialised when its first chunk is not stored.
    prefix: Optional[PrefixCursor] = None
    materialised: bool = True
    # Where the replicas may keep the session's state after k chunks (deployments/replicas/
    # snapshots.py) when that state is not its own keys' (`snapshot_ids`): k -> (DiT snapshot id,
    # VAE snapshot id) of the session it was served from (the prefix store) or copied from (a
    # fork, a rewind). Filled only when the server keeps snapshots.
    inherited_snapshots: dict[int, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = self.dit_key = self.vae_key = new_routing_key(self.spec)
        self.prompt = self.spec.prompt

    def snapshot_ids(self, chunks: int) -> tuple[str, str]:
        """(DiT, VAE) snapshot ids of the session's state after `chunks` chunks: inherited, else
        its own keys' (a replica that keeps none of them answers `NoSnapshot`)."""
        inherited = self.inherited_snapshots.get(chunks)
        if inherited is not None:
            return inherited
        return snapshot_id(self.dit_key, chunks), snapshot_id(self.vae_key, chunks)

    def inherit_snapshots(self, source: "Stream", chunks: int) -> None:
        """This session's first `chunks` chunks are `source`'s (a copy, a rewind's new keys): so
        are their snapshots."""
        self.inherited_snapshots = {k: source.snapshot_ids(k) for k in range(1, chunks + 1)}

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


def session_options(req: InferRequest, resolution: tuple[int, int], prompt: str, digest: str,
                    raw_frames: bool = False, principal: str = "") -> SessionOptions:
    """The session options of a first infer at output `resolution`; ProtocolError for
    unusable values. `prompt` and `digest` (of the image) are the request's, or on an implicit
    reset that changes one of them, the replaced session's other one; `principal`: the
    connection's (prefix/reuse.py `scope_of`), whose tag is the session's owner (wire.py)."""
    try:
        total = planned_latent_frames(req.num_frames)
    except ValueError as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
    return SessionOptions(
        session_id=req.session_id, prompt=prompt, image_digest=digest,
        resolution=resolution, seed=DEFAULT_SEED if req.seed is None else req.seed,
        total_latent_frames=total, translation_scale=req.translation_scale,
        intrinsics_resolution=tuple(req.intrinsics_resolution or DEFAULT_INTRINSICS_RESOLUTION),
        raw_frames=raw_frames, owner=owner_tag(principal) if principal else "",
    )
