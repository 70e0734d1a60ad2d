"""All DiT caches of one session: a self-attention and a cross-attention cache per layer
(model/dit/kv_cache.py), allocated for the session's geometry and window."""
from __future__ import annotations

import functools

import torch

from camera.frames import CHUNK_LATENT_FRAMES
from model.config import DiTConfig
from model.dit.kv_cache import CrossAttnCache, SelfAttnKVCache
from model.dit.kv_quant import SCALE_DTYPE


class DiTCaches:
    """All caches of one session: a self-attention and a cross-attention cache per layer."""

    def __init__(self, self_attn: list[SelfAttnKVCache], cross_attn: list[CrossAttnCache]) -> None:
        assert len(self_attn) == len(cross_attn)
        self.self_attn = self_attn
        self.cross_attn = cross_attn

    @classmethod
    def allocate(
        cls,
        cfg: DiTConfig,
        frame_seqlen: int,
        total_latent_frames: int | None,
        dtype: torch.dtype,
        device: torch.device | str,
        max_attention_size: int | None = None,
        fp8: bool = False,
        codes: bool = False,
        ring: bool = False,
    ) -> "DiTCaches":
        """Fresh zeroed caches for one session (never shared with another session).

        Capacity: `frame_seqlen * local_attn_size` with a window, else `frame_seqlen *
        total_latent_frames` (one chunk when the length is unknown; grows on demand).
        `max_attention_size` (tokens) shrinks the visible window; None = the whole cache.
        `fp8`: self-attention K/V stored as float8 with per-token, per-head scales; `codes`: as
        the FP8 attention's e4m3 codes with one descale per layer and tensor (model/dit/kv_codes.py);
        `ring`: a window as a ring (`SelfAttnKVCache`; not with `fp8`).
        """
        if frame_seqlen <= 0:
            raise ValueError(f"frame_seqlen must be positive, got {frame_seqlen}")
        rolling = cfg.local_attn_size != -1
        if rolling:
            frames = cfg.local_attn_size
        elif total_latent_frames is None:
            frames = CHUNK_LATENT_FRAMES
        elif total_latent_frames <= 0:
            raise ValueError(f"total_latent_frames must be positive, got {total_latent_frames}")
        else:
            frames = total_latent_frames
        if codes:
            from model.dit.kv_codes import Fp8CodesKVCache as layer
        else:
            layer = functools.partial(SelfAttnKVCache, fp8=fp8)
        self_attn = [layer(frame_seqlen * frames, cfg.num_heads, cfg.head_dim, dtype, device, rolling,
                           cfg.sink_size * frame_seqlen, max_attention_size, ring=ring) for _ in range(cfg.num_layers)]
        cross = [
            CrossAttnCache(cfg.text_len, cfg.num_heads, cfg.head_dim, dtype, device)
            for _ in range(cfg.num_layers)
        ]
        return cls(self_attn, cross)

    @staticmethod
    def kv_bytes(cfg: DiTConfig, frame_seqlen: int, kv_frames: int, dtype: torch.dtype, fp8: bool = False,
                 codes: bool = False) -> int:
        """Bytes of a session's caches holding `kv_frames` latent frames (admission control;
        `fp8` / `codes` as `allocate`)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        tokens = frame_seqlen * kv_frames
        scale_size = torch.empty((), dtype=SCALE_DTYPE).element_size()
        if codes:  # one byte per element, a descale per tensor
            self_attn = tokens * cfg.dim + scale_size
        elif fp8:
            self_attn = tokens * (cfg.dim + cfg.num_heads * scale_size)
        else:
            self_attn = tokens * cfg.dim * itemsize
        per_layer = 2 * (self_attn + cfg.text_len * cfg.dim * itemsize)
        return cfg.num_layers * per_layer

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.self_attn) + sum(c.nbytes for c in self.cross_attn)

    @property
    def global_end(self) -> int:
        return self.self_attn[0].global_end

    @property
    def local_end(self) -> int:
        return self.self_attn[0].local_end

    def ensure_capacity(self, tokens: int) -> None:
        """Grow every layer's self-attention cache to hold `tokens` (no-op when it fits)."""
        for c in self.self_attn:
            c.ensure_capacity(tokens)

    def reset(self) -> None:
        for c in self.self_attn:
            c.reset()
        for c in self.cross_attn:
            c.reset()
