"""Explicit per-session state of the DiT and of the VAE (one object each, owned by a replica).

The model modules hold weights only; everything that changes while a session streams lives
here, so one DiT (or VAE) serves many sessions and a session can be dropped or rebuilt.
"""
from __future__ import annotations

from collections.abc import Callable

from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np
import torch

from camera.frames import CHUNK_LATENT_FRAMES, DEFAULT_INTRINSICS_RESOLUTION
from model.dit.plucker import CameraTrack
from model.dit.caches import DiTCaches
from model.dit.sampler import NoisePlan
from model.vae.cache import VaeCache

VAE_STRIDE = 8  # pixels per latent cell (spatial)
PATCH_TOKENS = 4  # latent cells per DiT token (patch 1x2x2)


def frame_tokens(height: int, width: int) -> int:
    """DiT tokens of one latent frame of a `height` x `width` video (pixels)."""
    return (height // VAE_STRIDE) * (width // VAE_STRIDE) // PATCH_TOKENS


class SessionStatus(Enum):
    OPEN = auto()
    CLOSED = auto()


class SessionClosed(RuntimeError):
    """A call on a session that was closed (open a new one)."""


@dataclass(frozen=True, slots=True)
class DiTSessionSpec:
    """What a DiT session is opened with."""

    context: torch.Tensor  # [L, text_dim] text-encoder output (unpadded)
    height: int  # output pixels (multiple of 16)
    width: int
    seed: int = 42
    total_latent_frames: int | None = None  # known length -> the reference's noise plan
    translation_scale: float | None = None  # None -> per-chunk normalisation
    intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION
    # True: this session attends to all its frames even where the engine's config has a rolling
    # window (a server gives declared-length sessions that fit its budget exact full attention
    # and the window to the others); False: the engine's config decides (window or full).
    full_attention: bool = False

    def __post_init__(self) -> None:
        if self.height <= 0 or self.width <= 0 or self.height % 16 or self.width % 16:
            raise ValueError(f"output size must be positive multiples of 16, got {self.height}x{self.width}")
        if self.context.ndim != 2 or self.context.shape[0] < 1:
            raise ValueError(f"context must be [L, text_dim], got {tuple(self.context.shape)}")

    @property
    def lat_h(self) -> int:
        return self.height // VAE_STRIDE

    @property
    def lat_w(self) -> int:
        return self.width // VAE_STRIDE

    @property
    def frame_seqlen(self) -> int:
        return frame_tokens(self.height, self.width)


@dataclass(eq=False)
class DiTSession:
    """State of one session on a DiT replica: caches, text embedding, camera, noise, position."""

    spec: DiTSessionSpec
    caches: DiTCaches
    text: torch.Tensor  # [1, text_len, dim] embedded context
    camera: CameraTrack
    noise: NoisePlan
    chunk_index: int = 0
    status: SessionStatus = SessionStatus.OPEN
    # Optional observer of every DiT call (golden checks, debugging); None in serving.
    trace: list[dict] | None = None
    # The last chunk's cache-update call when its step deferred it (`DiTEngine.step(defer_update=
    # True)`): run by `DiTEngine.finish_chunk`, at the latest before the next chunk.
    pending_update: Callable[[], None] | None = None
    # An FP8 code cache's growth by chunks given up (preempted) since the last chunk made: their
    # denoising calls grew the descales too, so the next chunk's growth record starts with it
    carried_growth: torch.Tensor | None = None

    @property
    def start_token(self) -> int:
        return self.chunk_index * CHUNK_LATENT_FRAMES * self.spec.frame_seqlen

    def check_open(self) -> None:
        if self.status is SessionStatus.CLOSED:
            raise SessionClosed("session is closed; open a new one")

    def close(self) -> None:
        self.pending_update = None
        with torch.inference_mode():  # the caches are inference tensors
            self.caches.reset()
        self.status = SessionStatus.CLOSED


@dataclass(eq=False)
class VaeSession:
    """State of one session on a VAE replica: the conditioning image and both causal caches."""

    image: torch.Tensor  # [3, h, w] preprocessed first frame (not clamped)
    enc_cache: VaeCache = field(default_factory=VaeCache.empty)
    dec_cache: VaeCache = field(default_factory=VaeCache.empty)
    encoded_chunks: int = 0
    decoded_chunks: int = 0
    status: SessionStatus = SessionStatus.OPEN

    @property
    def height(self) -> int:
        return self.image.shape[1]

    @property
    def width(self) -> int:
        return self.image.shape[2]

    @property
    def nbytes(self) -> int:
        return self.image.nbytes + self.enc_cache.nbytes + self.dec_cache.nbytes

    def check_open(self) -> None:
        if self.status is SessionStatus.CLOSED:
            raise SessionClosed("session is closed; open a new one")

    def close(self) -> None:
        self.enc_cache = VaeCache.empty()
        self.dec_cache = VaeCache.empty()
        self.status = SessionStatus.CLOSED


@dataclass(frozen=True, slots=True)
class PastChunk:
    """One finished chunk of a session, as kept outside the replica to rebuild it (recovery)."""

    poses: np.ndarray  # [N, 4, 4] the chunk's camera poses as received
    intrinsics: np.ndarray  # [N, 4]
    y: torch.Tensor  # [20, 3, lh, lw] its conditioning
    latents: torch.Tensor  # float32 [16, 3, lh, lw] its clean x0
    context: torch.Tensor | None = None  # [L, text_dim]: a prompt update applied before this chunk
    kv_growth: torch.Tensor | None = None  # its FP8 code caches' growth record (ChunkOutput.kv_growth)
