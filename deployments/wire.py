"""What the ingress hands the DiT deployment over Ray to open or rebuild a session.

Plain numpy and Python values (no torch in the ingress process); the DiT replica turns them
into the model's `DiTSessionSpec` and `PastChunk`s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

WireNoise = tuple[np.ndarray, bool]  # (CPU generator state bytes, whole-video noise drawn)
# A past chunk as the ingress journals it: poses [N, 4, 4], intrinsics [N, 4], y, latents, and the
# text context [L, text_dim] of a prompt update made before it (None: none).
WirePastChunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]


@dataclass(frozen=True, slots=True)
class DiTOpenSpec:
    """A DiT session's opening arguments (`DiTDeployment.reserve` / `.open` / `.restore`)."""

    context: Optional[np.ndarray]  # float32 [L, text_dim]: the prompt's text-encoder output (None: `reserve`)
    height: int  # output pixels
    width: int
    seed: int
    total_latent_frames: Optional[int]  # from the declared `num_frames`; None: open-ended
    translation_scale: Optional[float]  # None: per-chunk normalisation
    intrinsics_resolution: tuple[int, int]  # [H, W] the intrinsics are given in
