"""What the ingress and the DiT deployment hand each other over Ray (one type per message).

Plain numpy and Python values (no torch, no pydantic: the ingress process imports neither the
model nor the replicas). The DiT replica derives the model's `DiTSessionSpec` and
`model.session.PastChunk`s from them.

Names: a session's `session_id` is the client's; a `routing_key` (`<session_id>~<owner>.<random>`,
one per incarnation of a session on one deployment, deployments/ingress/stream.py) is what the
router pins and what a replica keys its state by. `<owner>` is `owner_tag` of the session's
principal (its API key, else its client address): a replica shares what it keeps between
principals by it (its snapshots, deployments/replicas/snapshots.py) without learning who they are.
"""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Optional

import numpy as np

KEY_SEPARATOR = "~"  # between the client's session id and what the server adds
OWNER_SEPARATOR = "."  # between the owner tag and the random part


def owner_tag(principal: str) -> str:
    """A principal's tag (12 hex digits of a digest): its sessions' owner as the replicas see it."""
    return hashlib.sha256(principal.encode()).hexdigest()[:12]


def routing_key(session_id: str, owner: str = "") -> str:
    """A new routing key of `session_id`, owned by `owner` (a tag; "": nobody's in particular)."""
    return f"{session_id}{KEY_SEPARATOR}{owner}{OWNER_SEPARATOR}{uuid.uuid4().hex[:12]}"


def owner_of(key: str) -> str:
    """The owner tag of a routing key ("" for a key without one: tests, older ingresses)."""
    _, sep, suffix = key.rpartition(KEY_SEPARATOR)
    owner, dot, _ = suffix.partition(OWNER_SEPARATOR)
    return owner if sep and dot else ""


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """A session's options, fixed for its life: built once from its first infer (at the
    output size the ingress chose) and carried unchanged to the replicas."""

    session_id: str  # the client's
    prompt: str  # as opened (a prompt update changes what the session attends to, not this)
    image_digest: str  # identity of the image as sent (deployments/ingress/stream.py `image_digest`)
    resolution: tuple[int, int]  # output pixels (h, w)
    seed: int
    total_latent_frames: Optional[int]  # from the declared `num_frames`; None: open-ended, per-chunk noise
    translation_scale: Optional[float]  # None: per-chunk normalisation
    intrinsics_resolution: tuple[int, int]  # [H, W] the intrinsics are given in
    raw_frames: bool = False  # the VAE answers raw RGB frames, not fMP4 (the transport's choice: clip mode)
    owner: str = ""  # `owner_tag` of its principal: in its routing keys; the text encoder's cache scope
    # A `/v1/videos` job's (the transport's choice, videos/runner.py): nobody watches it live, so the
    # replicas run its calls after the live sessions' and count it apart (replicas/priority_lock.py)
    offline: bool = False

    @property
    def height(self) -> int:
        return self.resolution[0]

    @property
    def width(self) -> int:
        return self.resolution[1]


@dataclass(frozen=True, slots=True)
class NoiseSnapshot:
    """The DiT's noise generator after a chunk (the model's `NoiseState`, as numpy)."""

    rng: np.ndarray  # uint8: the CPU generator's state
    whole_drawn: bool  # the whole-video noise was drawn (a session of declared length)


@dataclass(frozen=True, slots=True)
class PastChunk:
    """One finished chunk as the ingress journals it and hands it back to rebuild the session."""

    poses: np.ndarray  # [N, 4, 4] as received
    intrinsics: np.ndarray  # [N, 4]
    y: np.ndarray  # [20, 3, lh, lw] its conditioning (one array shared by equal consecutive y)
    latents: np.ndarray  # float32 [16, 3, lh, lw] its clean x0
    context: Optional[np.ndarray] = None  # [L, text_dim]: a prompt update applied before this chunk
    # float32 [layers, calls, pieces, 4]: its FP8 code caches' growth during its denoising calls,
    # redone by a rebuild before its clean write (model/dit/kv_codes.py); None: other cache formats
    kv_growth: Optional[np.ndarray] = None


@dataclass(frozen=True, slots=True)
class ChunkStep:
    """`DiTDeployment.step`'s argument: one chunk's inputs."""

    y: np.ndarray  # float32 [20, 3, lh, lw]: its conditioning (the VAE's `condition`)
    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [N, 4]
    context: Optional[np.ndarray] = None  # [L, text_dim]: a prompt update applied before the chunk


@dataclass(frozen=True, slots=True)
class StepResult:
    """`DiTDeployment.step`'s answer: one chunk's latents, with what the ingress journals and reports."""

    latents: np.ndarray  # float32 [16, 3, lh, lw]: the chunk's clean x0
    noise: NoiseSnapshot  # after this chunk (the journal's, for a rebuild)
    # Seconds per DiT stage; with the cache update deferred, `previous_cache_update` is the
    # previous chunk's (it ran before this one), so that their sum is still the DiT's time per chunk.
    timings: dict[str, float]
    replica: str  # the replica that ran it (debug fields)
    kv_growth: Optional[np.ndarray] = None  # the FP8 code caches' growth record (PastChunk.kv_growth), journaled

    @property
    def dit_s(self) -> float:
        """The chunk's `dit` stage (seconds)."""
        return sum(self.timings.values())
