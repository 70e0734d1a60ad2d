"""Bytes one VAE session holds at a given output size, for the VAE replica's admission.

A VAE session keeps, between chunks, the causal-conv history of its encoder and decoder
streams (`VaeCache`: the last 1-2 input frames of every temporal conv) and its preprocessed
image. Those slots' shapes are the model's own: rather than a constant, `CacheLayout.probe`
runs one session of two chunks at a probe size and records every slot's channels, frames,
dtype and spatial scale (slot height / output height: 1, 1/2, 1/4, 1/8). A slot's bytes at
another size are then exact: channels x frames x (H x scale) x (W x scale) x itemsize.

While one of its calls runs, a session also needs that call's activations (`working`): a
reservation, like the DiT's, of WORKING_ROWS tensors of the largest full-resolution slot's
channels over one call's frames plus the conv history (CHUNK_STEP_FRAMES + CACHE_T), and the
decoded chunk in float32 and uint8. The VAE runs one call at a time per replica, so the budget
needs the held bytes of all sessions plus one working set. The fMP4 muxer's x264 state lives in
host memory (its reference frame and bitstream buffers, MUXER_FRAMES YUV 4:2:0 frames) and counts
against the budget only where the VAE itself runs on the CPU.

Calibration (bf16, 464x832, docs/PERFORMANCE.md served runs 1 and 2): the VAE replica peaked
at 10.6 GiB with 2 sessions and 13.3 GiB with 3. The probe gives 2.71 GiB held per session;
WORKING_ROWS 12 gives 5.0 GiB working, so 0.24 (weights) + n x 2.71 + 5.0 = 10.7 and 13.4 GiB.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from camera.frames import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES
from model.vae.cache import CACHE_T

WORKING_ROWS = 12  # full-resolution activation tensors of one call (calibration: module docstring)
CHUNK_STEP_FRAMES = 4  # video frames one decoder step (one latent frame) or encoder step produces / takes
# With WanVAE.batch_frames a chunk's 12 frames go through in one call: measured on the H200 at
# 464x832 (benchmarks/results/h200_round2_vae_batched.json) its peak rose 0.49 GiB over the
# per-latent-frame calls, about 0.6 of one WORKING_ROWS frame row (0.83 GiB there): one more row.
BATCHED_EXTRA_FRAMES = 1
MUXER_FRAMES = 4  # YUV 4:2:0 frames of x264 state per session (reference, reconstruction, input, bitstream)
PROBE_SIZE = (32, 32)  # output pixels of the probe when no serving size is given (levels 32, 16, 8, 4)
GRAY = 127


@dataclass(frozen=True, slots=True)
class VaeFootprint:
    """Bytes of one VAE session: `held` between chunks, `working` more while one call runs."""

    held: int
    working: int

    @property
    def total(self) -> int:
        return self.held + self.working


@dataclass(frozen=True, slots=True)
class _Slot:
    channels: int
    frames: int
    scale_h: Fraction  # slot height / output height
    scale_w: Fraction
    itemsize: int

    def nbytes(self, height: int, width: int) -> int:
        h, w = self.scale_h * height, self.scale_w * width
        return self.channels * self.frames * int(np.ceil(h)) * int(np.ceil(w)) * self.itemsize


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The cache slots of one VAE session (both streams) and its image, size-independent."""

    slots: tuple[_Slot, ...]
    image_itemsize: int  # the preprocessed image [3, H, W]
    host_muxer: bool  # the muxer's host memory is on the budget's device (a CPU VAE)
    batched: bool = False  # the VAE runs a chunk's frames in one call (WanVAE.batch_frames)

    @classmethod
    def probe(cls, engine, size: tuple[int, int] = PROBE_SIZE) -> "CacheLayout":
        """Run one session of two chunks (condition + decode each) at `size` and read its caches."""
        h, w = size
        session = engine.open(np.full((h, w, 3), GRAY, dtype=np.uint8), h, w)
        try:
            for _ in range(2):  # the second call of each stream holds the steady-state history
                engine.condition(session)
                engine.decode_float(session, torch.zeros(16, CHUNK_LATENT_FRAMES, h // 8, w // 8))
            slots = tuple(
                _Slot(t.shape[1], t.shape[2], Fraction(t.shape[3], h), Fraction(t.shape[4], w), t.element_size())
                for cache in (session.enc_cache, session.dec_cache) for t in cache.frames.values()
            )
            itemsize = session.image.element_size()
        finally:
            engine.close(session)
        return cls(slots, itemsize, engine.device.type == "cpu", bool(engine.vae.batch_frames))

    def footprint(self, height: int, width: int) -> VaeFootprint:
        caches = sum(s.nbytes(height, width) for s in self.slots)
        image = 3 * height * width * self.image_itemsize
        muxer = MUXER_FRAMES * height * width * 3 // 2 if self.host_muxer else 0
        full = [s for s in self.slots if s.scale_h == 1 and s.scale_w == 1]
        channels = max((s.channels for s in full), default=3)
        itemsize = max((s.itemsize for s in self.slots), default=4)
        frames = CHUNK_STEP_FRAMES + CACHE_T + (BATCHED_EXTRA_FRAMES if self.batched else 0)
        activations = WORKING_ROWS * channels * frames * height * width * itemsize
        chunk = CHUNK_VIDEO_FRAMES * height * width * 3 * (4 + 1)  # decoded float32 + its uint8 frames
        return VaeFootprint(caches + image + muxer, activations + chunk)
