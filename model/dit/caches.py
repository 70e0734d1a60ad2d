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


def join_growth(first: torch.Tensor | None, then: torch.Tensor | None) -> torch.Tensor | None:
    """Two growth records (`DiTCaches.take_growth`) one after the other: their calls in order,
    pieces padded to the wider (first row -1)."""
    if first is None or then is None:
        return then if first is None else first
    pieces = max(first.shape[2], then.shape[2])

    def padded(g: torch.Tensor) -> torch.Tensor:
        if g.shape[2] == pieces:
            return g
        pad = torch.zeros(*g.shape[:2], pieces - g.shape[2], g.shape[3])
        pad[..., 0] = -1.0
        return torch.cat([g, pad], dim=2)
    return torch.cat([padded(first), padded(then)], dim=1)


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

    # ---- the growth record of FP8 code caches (model/dit/kv_codes.py): rebuilds that repeat ----

    def record_growth(self) -> None:
        """Record the writes from here on (a chunk's denoising calls) in each code cache; no-op
        for the other formats (their writes depend on nothing a rebuild leaves out)."""
        for c in self.self_attn:
            if isinstance(c, Fp8CodesKVCache):
                c.recording = []

    def take_growth(self) -> torch.Tensor | None:
        """The writes recorded since `record_growth`, float32 CPU [layers, calls, pieces,
        GROWTH_FIELDS] (pieces padded with first row -1), and recording stops; None when no code
        cache recorded (or a call wrote nothing)."""
        records = [c.recording for c in self.self_attn if isinstance(c, Fp8CodesKVCache)]
        for c in self.self_attn:
            if isinstance(c, Fp8CodesKVCache):
                c.recording = None
        if not records or not records[0]:
            return None
        pieces = max(len(call) for layer in records for call in layer)
        pad = torch.zeros(2, device=records[0][0][0][2].device)
        values = torch.stack([torch.stack([torch.stack([p[2] for p in call] + [pad] * (pieces - len(call)))
                                           for call in layer]) for layer in records])
        values = values.cpu()  # one copy to the host (the step synchronises for its latents anyway)
        head = torch.tensor([[[[float(p[0]), p[1]] for p in call] + [[-1.0, 0.0]] * (pieces - len(call))
                              for call in layer] for layer in records], dtype=torch.float32)
        return torch.cat([head, values], dim=-1)

    def regrow(self, growth: torch.Tensor, start: int, rows: int) -> None:
        """Redo a chunk's recorded growth (`take_growth`'s) before its clean write at token
        `start` (`rows` tokens): a rebuilt session's code caches then hold exactly the bytes
        the computed one held (`Fp8CodesKVCache.regrow`)."""
        layers = [c for c in self.self_attn if isinstance(c, Fp8CodesKVCache)]
        if len(layers) != growth.shape[0]:
            raise ValueError(f"a growth record of {growth.shape[0]} layers for {len(layers)} code caches")
        for cache, calls in zip(layers, growth):
            cache.regrow(calls, start, rows)

    def clone(self) -> "DiTCaches":
        """An independent copy of every layer's caches (a forked session's; device to device)."""
        return DiTCaches([c.clone() for c in self.self_attn], [c.clone() for c in self.cross_attn])

    def reset(self) -> None:
        for c in self.self_attn:
            c.reset()
        for c in self.cross_attn:
            c.reset()
