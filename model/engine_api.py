"""The DiT engine's interface: the values its calls return."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
