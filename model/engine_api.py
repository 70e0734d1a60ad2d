"""The DiT engine's interface: what a server (deployments/replicas/dit.py) calls, and what an engine can do.

Two engines implement it: `DiTEngine` (model/engines.py; also one rank's `SPDiTEngine`) and the
sequence-parallel replica's `SPReplicaEngine` (deployments/replicas/sp_dit.py), which drives every rank
of a replica. A caller asks `capabilities` before it calls a method an engine may not support
(never `hasattr`): an unsupported call raises `NotImplementedError`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from model.config import DiTConfig
    from model.dit.sampler import NoiseState
    from model.session import DiTSession, DiTSessionSpec, PastChunk


@dataclass(frozen=True, slots=True)
class SessionFootprint:
    """Device bytes of one DiT session, for admission control.

    `held` stays allocated between chunks: the KV and cross-attention caches, the noise plan
    (the whole-video draw of a session with a known length), the text embedding. `working` is
    allocated only while one of its chunks runs: the chunk's camera features (per block
    1 + scale and shift), the activations of one DiT call and the sampler's tensors. A replica
    runs one chunk at a time, so it needs the sum of `held` plus the largest `working`.
    """

    held: int
    working: int

    @property
    def total(self) -> int:
        return self.held + self.working


@dataclass
class ChunkOutput:
    latents: torch.Tensor  # float32 CPU [16, 3, lh, lw]: the chunk's clean x0
    timings: dict[str, float] = field(default_factory=dict)
    # float32 CPU [layers, calls, pieces, 4]: the FP8 code caches' growth during its denoising
    # calls (`DiTCaches.take_growth`), journaled for a rebuild that repeats it; None: other formats
    kv_growth: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What a DiT engine supports beyond open / step / close.

    restore: rebuild a session from its finished chunks (`restore`, session recovery).
    update_prompt: prompt steering (`update_prompt`: a new text context from the next chunk on;
      a restored session replays the updates of its past chunks).
    deferred_update: `step(defer_update=True)` returns a chunk's latents before its cache-update
      call, which `finish_chunk` runs (a server decodes the chunk meanwhile).
    preempt: `step(should_stop=...)` gives a chunk up between its denoising calls, the session
      as before the step (a driven session whose keys changed while its chunk ran).
    clone: `clone` copies a live session into an independent one on the same device (a fork at
      the session's head, without replaying its chunks).
    """

    restore: bool = True
    update_prompt: bool = True
    deferred_update: bool = True
    preempt: bool = True
    clone: bool = True


class ChunkPreempted(Exception):
    """`step`'s `should_stop()` said yes: the chunk was given up; the session is as before it."""


class DiTEngineProtocol(Protocol):
    """The causal DiT with its sampler over many sessions' explicit state (docs/ARCHITECTURE.md)."""

    capabilities: EngineCapabilities

    @property
    def cfg(self) -> DiTConfig: ...

    @property
    def dit(self) -> torch.nn.Module: ...

    def session_cfg(self, full_attention: bool) -> DiTConfig:
        """The config a session's caches follow (without the window for full attention)."""

    def kv_frames(self, total_latent_frames: int | None, full_attention: bool = False) -> int:
        """Latent frames a session's self-attention cache holds (admission)."""

    def session_bytes(self, spec_h: int, spec_w: int, kv_frames: int) -> int:
        """Bytes of a session's KV and cross-attention caches (on one device)."""

    def footprint(self, height: int, width: int, kv_frames: int,
                  total_latent_frames: int | None) -> SessionFootprint:
        """Everything a session of this size holds on one device (admission)."""

    def open(self, spec: DiTSessionSpec) -> DiTSession:
        """A new session."""

    def restore(self, spec: DiTSessionSpec, past: Sequence[PastChunk],
                noise_state: NoiseState | None) -> DiTSession:
        """A session rebuilt from its finished chunks (`capabilities.restore`)."""

    def replay(self, session: DiTSession, spec: DiTSessionSpec, past: Sequence[PastChunk],
               noise_state: NoiseState | None) -> None:
        """`restore`'s rebuild of an opened session, resumable: `past` replayed after the chunks
        it has (a replica replays one chunk per call, between other sessions' calls), then the
        noise state when given (`capabilities.restore`)."""

    def clone(self, session: DiTSession) -> DiTSession:
        """An independent copy of a live session (`capabilities.clone`): both continue alike."""

    def step(self, session: DiTSession, y: torch.Tensor, poses: np.ndarray, intrinsics: np.ndarray,
             defer_update: bool = False, should_stop: Callable[[], bool] | None = None) -> ChunkOutput:
        """The session's next chunk (`defer_update`: `capabilities.deferred_update`).
        `should_stop()` is asked before each denoising call (`capabilities.preempt`): True gives
        the chunk up (`ChunkPreempted`), the session as it was before the step."""

    def finish_chunk(self, session: DiTSession) -> float:
        """Run a deferred cache update (no-op without one); its seconds."""

    def update_prompt(self, session: DiTSession, context: torch.Tensor) -> None:
        """From the next chunk on, attend to `context` [L, text_dim] (`capabilities.update_prompt`)."""

    def close(self, session: DiTSession) -> None:
        """Release the session's state."""
