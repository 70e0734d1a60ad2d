"""The self-attention cache of the FP8 attention, kept in the codes that attention reads
(`KVCacheConfig(format="fp8_codes")`, with `attention="cudnn_fp8"` or `"fa3_fp8"`: FA3 takes a
descale per batch row and KV head, to which the one per tensor here broadcasts exactly).

cuDNN's FP8 SDPA takes K and V as e4m3 codes with one descale per tensor. A bf16 cache makes
every call quantize the whole visible cache again (2 x 22620 rows per call in a full window,
5 calls per chunk: 91 % of the FP8 attention's quantization, docs/PERFORMANCE.md). This cache
stores the codes themselves with one running descale per layer and tensor: a call quantizes
only its own rows, with descale = max(descale, amax(new rows) / 448). When that grows, the
codes already cached are multiplied by old / new and rounded again (one pass over the cache,
skipped on the device by the kernel itself when the scale did not grow: no host sync), so every
cached row always dequantizes with the one current descale. Half the bytes of a bf16 cache.

The descale only grows within a session (reset: back to zero), so rows written early lose a
little precision when a later chunk is louder; the numerics against the bf16 cache are measured
by the benchmarks (docs/PERFORMANCE.md).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from model.dit.e4m3 import AMAX_FLOOR, E4M3, E4M3_MAX, TensorCodes  # AMAX_FLOOR: an all-zero chunk's descale is not 0
from model.dit.kv_cache import SelfAttnKVCache

# (codes, descale, new rows, start slot, rescale end) -> None: writes the rows as codes in place
AppendCodes = Callable[[tuple[Tensor, ...], Tensor, tuple[Tensor, ...], int, int | None], None]


def append_codes_reference(codes: tuple[Tensor, ...], descale: Tensor, new: tuple[Tensor, ...], start: int,
                           rescale: int | None = None) -> None:
    """Write K and V's `new` rows [L, H, D] (or one tensor's) as codes at slot `start` of `codes`
    ([cap, H, D] each), growing `descale` ([2]: K's, V's; [1] for one) to cover them and
    rescaling slots [0, rescale) (default [0, start)). The function the Triton kernels compute
    (model/accel/triton_tensor_quant.py `append_codes`, injected as the cache's `append`); codes
    of another dtype than e4m3 (float32: the quotients unrounded) are written in theirs."""
    rescale = start if rescale is None else rescale
    for i, (c, x) in enumerate(zip(codes, new)):
        old = descale[i : i + 1]
        grown = torch.maximum(old, x.abs().amax().float().clamp(min=AMAX_FLOOR).reshape(1) / E4M3_MAX)
        if rescale:
            c[:rescale] = (c[:rescale].float() * (old / grown)).to(c.dtype)
        c[start : start + x.shape[0]] = (x.float() / grown).clamp(-E4M3_MAX, E4M3_MAX).to(c.dtype)
        old.copy_(grown)


class Fp8CodesKVCache(SelfAttnKVCache):
    """One layer's self-attention cache as e4m3 codes with one running descale per tensor.

    `update` returns ((K codes, K descale), (V codes, V descale)) over the slots the chunk
    attends to: what `CudnnFp8Attention.codes` takes without quantizing them again. K may come
    coded already (`TensorCodes`: codes [L, H, D] with the fixed descale they were made with, the
    fast block's bound scales, `AccelOptions.qk_bound_scales`): copied as they are, K's descale
    set to theirs (a session's K must then always come so); V is quantized here.

    As a ring (`ring`, `SelfAttnKVCache`) its slots never move: no codes copied down per chunk.
    `append` writes the codes: `append_codes_reference` or a device kernel with its signature
    (injected by whoever builds the caches; model/accel has the Triton one).
    """

    def __init__(self, capacity: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 rolling: bool = False, sink_tokens: int = 0, max_attention_size: int | None = None,
                 ring: bool = False, append: AppendCodes = append_codes_reference) -> None:
        super().__init__(capacity, heads, head_dim, E4M3, device, rolling, sink_tokens, max_attention_size,
                         ring=ring)
        self.dtype = dtype  # the chunk's K/V as they come in
        self._append = append
        self.descale = torch.zeros(2, dtype=torch.float32, device=device)  # K's, V's

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.descale.nbytes

    def _write_rows(self, slot: int, k: Tensor | TensorCodes, v: Tensor, rows: slice, rescale: int) -> None:
        """Rows `rows` of the chunk's K and V at `slot`; when a descale grows, slots [0, rescale)
        are rescaled (everything valid but the rows written here)."""
        if isinstance(k, tuple):
            codes, descale = k
            piece = codes[rows]
            self.k[slot : slot + piece.shape[0]] = piece
            self.descale[0:1].copy_(descale)
            self._append((self.v,), self.descale[1:2], (v[rows],), slot, rescale)
        else:
            self._append((self.k, self.v), self.descale, (k[rows], v[rows]), slot, rescale)

    def _read(self, lo: int, k: Tensor | TensorCodes, v: Tensor) -> tuple[TensorCodes, TensorCodes]:
        end = self.local_end
        return (self.k[lo:end], self.descale[0:1]), (self.v[lo:end], self.descale[1:2])

    def reset(self) -> None:
        super().reset()
        self.descale.zero_()
