"""All DiT caches of one session: a self-attention and a cross-attention cache per layer
(model/dit/kv_cache.py), allocated for the session's geometry and window, in the form that one
`KVCacheConfig` chooses for every session of an engine."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from camera.frames import CHUNK_LATENT_FRAMES
from model.config import DiTConfig
from model.dit.kv_cache import CrossAttnCache, SelfAttnKVCache
from model.dit.kv_codes import AppendCodes, Fp8CodesKVCache, append_codes_reference
from model.dit.kv_quant import SCALE_DTYPE

KVFormat = Literal["dtype", "fp8_scaled", "fp8_codes"]
KV_FORMATS: tuple[str, ...] = get_args(KVFormat)


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """How the sessions' self-attention caches store their K/V (the window and sink are the
    model's, `DiTConfig.local_attn_size` / `sink_size`; the cross-attention caches always keep the
    compute dtype).

    format: "dtype": the compute dtype (exact; the reference's). "fp8_scaled": float8 e4m3 with
      per-token, per-head scales (model/dit/kv_quant.py): about half the bytes, changed numerics,
      attention reads a compute-dtype copy. "fp8_codes": the FP8 attention's e4m3 codes with one
      running descale per layer and tensor (model/dit/kv_codes.py): half the bytes, read only by
      `attention="cudnn_fp8"` or `"fa3_fp8"` (model/accel), which take the codes as they are.
    ring: a window as a ring (`SelfAttnKVCache`): a chunk's K/V go to the evicted tokens' slots,
      nothing is copied down per chunk; the keys' order in the softmax's sums changes (the
      reference shifts its window). Not with "fp8_scaled" (its per-token scales are read back
      from the slots).
    """

    format: KVFormat = "dtype"
    ring: bool = False

    def __post_init__(self) -> None:
        if self.format not in KV_FORMATS:
            raise ValueError(f"KV cache format must be one of {KV_FORMATS}, got {self.format!r}")
        if self.ring and self.format == "fp8_scaled":
            raise ValueError("a ring cache reads its chunk back from the slots: not with fp8_scaled's per-token "
                             "scales")

    @classmethod
    def for_serving(cls, device: str | torch.device, kv_cache: Literal["dtype", "fp8"] = "dtype",
                    fp8_attention: bool = False) -> "KVCacheConfig":
        """The caches a replica on `device` serves with (`deployments.config.ModelArgs`'s
        `kv_cache` and `fp8_attention`): the FP8 attention's codes when it runs (session 6: the
        windowed FP8 chunk 1.222 -> 1.166 s), else per-token FP8 with `kv_cache: fp8`, else the
        compute dtype; on CUDA a window as a ring (sessions 7 and 9: the shifting window's copies
        cost ~11 ms per bf16 chunk) unless the format cannot (fp8_scaled keeps the shift); on the
        CPU the reference's shifting window."""
        format = "fp8_codes" if fp8_attention else "fp8_scaled" if kv_cache == "fp8" else "dtype"
        return cls(format, ring=torch.device(device).type == "cuda" and format != "fp8_scaled")


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
        kv: KVCacheConfig = KVCacheConfig(),
        append_codes: AppendCodes = append_codes_reference,
    ) -> "DiTCaches":
        """Fresh zeroed caches for one session (never shared with another session).

        Capacity: `frame_seqlen * local_attn_size` with a window, else `frame_seqlen *
        total_latent_frames` (one chunk when the length is unknown; grows on demand).
        `max_attention_size` (tokens) shrinks the visible window; None = the whole cache.
        `kv`: the self-attention caches' format and ring (`KVCacheConfig`); `append_codes`: the
        function that writes "fp8_codes" (a device kernel injected by the caller, model/accel).
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
        if kv.format == "fp8_codes":
            layer = functools.partial(Fp8CodesKVCache, append=append_codes)
        else:
            layer = functools.partial(SelfAttnKVCache, fp8=kv.format == "fp8_scaled")
        self_attn = [layer(frame_seqlen * frames, cfg.num_heads, cfg.head_dim, dtype, device, rolling,
                           cfg.sink_size * frame_seqlen, max_attention_size, ring=kv.ring) for _ in range(cfg.num_layers)]
        cross = [
            CrossAttnCache(cfg.text_len, cfg.num_heads, cfg.head_dim, dtype, device)
            for _ in range(cfg.num_layers)
        ]
        return cls(self_attn, cross)

    @staticmethod
    def kv_bytes(cfg: DiTConfig, frame_seqlen: int, kv_frames: int, dtype: torch.dtype,
                 format: KVFormat = "dtype") -> int:
        """Bytes of a session's caches holding `kv_frames` latent frames (admission control;
        `format`: `KVCacheConfig.format`)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        tokens = frame_seqlen * kv_frames
        scale_size = torch.empty((), dtype=SCALE_DTYPE).element_size()
        if format == "fp8_codes":  # one byte per element, a descale per tensor
            self_attn = tokens * cfg.dim + scale_size
        elif format == "fp8_scaled":
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

    def clone(self) -> "DiTCaches":
        """An independent copy of every layer's caches (a forked session's; device to device)."""
        return DiTCaches([c.clone() for c in self.self_attn], [c.clone() for c in self.cross_attn])

    def reset(self) -> None:
        for c in self.self_attn:
            c.reset()
        for c in self.cross_attn:
            c.reset()
