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

# (codes, descale, new rows, start slot, rescale end) -> the new rows' amax per tensor: writes the
# rows as codes in place
AppendCodes = Callable[[tuple[Tensor, ...], Tensor, tuple[Tensor, ...], int, int | None], Tensor]
# A growth record's rows (`Fp8CodesKVCache.recording`): per piece of rows written, (first row of
# the piece in its chunk, 1 when K came coded, K's amax or its coded descale, V's amax)
GROWTH_FIELDS = 4


def append_codes_reference(codes: tuple[Tensor, ...], descale: Tensor, new: tuple[Tensor, ...], start: int,
                           rescale: int | None = None) -> Tensor:
    """Write K and V's `new` rows [L, H, D] (or one tensor's) as codes at slot `start` of `codes`
    ([cap, H, D] each), growing `descale` ([2]: K's, V's; [1] for one) to cover them and
    rescaling slots [0, rescale) (default [0, start)). The function the Triton kernels compute
    (model/accel/triton_tensor_quant.py `append_codes`, injected as the cache's `append`); codes
    of another dtype than e4m3 (float32: the quotients unrounded) are written in theirs."""
    rescale = start if rescale is None else rescale
    amaxes = []
    for i, (c, x) in enumerate(zip(codes, new)):
        old = descale[i : i + 1]
        amax = x.abs().amax().float().reshape(1)
        amaxes.append(amax)
        grown = torch.maximum(old, amax.clamp(min=AMAX_FLOOR) / E4M3_MAX)
        if rescale:
            c[:rescale] = (c[:rescale].float() * (old / grown)).to(c.dtype)
        c[start : start + x.shape[0]] = (x.float() / grown).clamp(-E4M3_MAX, E4M3_MAX).to(c.dtype)
        old.copy_(grown)
    return torch.cat(amaxes)


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
        # The growth record of the writes a rebuild cannot redo (a chunk's denoising calls, whose
        # noisy rows the clean ones overwrite, but whose amax grew the descale and rescaled the
        # codes cached before them): per `update`, per piece, (its first row, 1.0 when K came
        # coded, [K's amax or coded descale, V's amax] on the device) (None: not recording)
        self.recording: list[list[tuple[int, float, Tensor]]] | None = None

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.descale.nbytes

    def update(self, k: Tensor | TensorCodes, v: Tensor, start: int):
        if self.recording is not None:
            self.recording.append([])
        return super().update(k, v, start)

    def _write_rows(self, slot: int, k: Tensor | TensorCodes, v: Tensor, rows: slice, rescale: int) -> None:
        """Rows `rows` of the chunk's K and V at `slot`; when a descale grows, slots [0, rescale)
        are rescaled (everything valid but the rows written here)."""
        if isinstance(k, tuple):
            codes, descale = k
            piece = codes[rows]
            self.k[slot : slot + piece.shape[0]] = piece
            self.descale[0:1].copy_(descale)
            amax = self._append((self.v,), self.descale[1:2], (v[rows],), slot, rescale)
            record = (1.0, descale.reshape(1).float(), amax.reshape(1))
        else:
            amax = self._append((self.k, self.v), self.descale, (k[rows], v[rows]), slot, rescale)
            record = (0.0, amax[0:1], amax[1:2])
        if self.recording is not None:  # the values stay on the device: no copy, no sync per write
            coded, k_value, v_amax = record
            self.recording[-1].append((rows.start, coded, torch.cat([k_value, v_amax])))

    def regrow(self, calls: Tensor, start: int, rows: int) -> None:
        """Redo a growth record (`calls` [C, P, GROWTH_FIELDS], pieces with a negative first row
        absent) before the clean write of a chunk of `rows` rows at token `start`: for each
        recorded `update`, the same `update` with rows that are zero but, at each piece's first
        row, its recorded amax (K: its recorded codes' descale), so that each write finds the
        same amax, grows the descale and rescales the cached codes exactly as the recorded one
        did. Its own rows are overwritten by the clean write after, as the recorded ones were."""
        heads, dim = self.k.shape[1], self.k.shape[2]
        for pieces in calls.tolist():
            k = torch.zeros(rows, heads, dim, dtype=self.dtype, device=self.k.device)
            v = torch.zeros_like(k)
            coded = None
            for first, is_coded, k_value, v_amax in pieces:
                if first < 0:
                    continue
                v[int(first), 0, 0] = v_amax
                if is_coded:
                    coded = k_value
                else:
                    k[int(first), 0, 0] = k_value
            if coded is not None:
                descale = torch.tensor([coded], dtype=torch.float32, device=self.k.device)
                self.update((torch.zeros(rows, heads, dim, dtype=self.k.dtype, device=self.k.device), descale), v,
                            start)
            else:
                self.update(k, v, start)

    def _read(self, lo: int, k: Tensor | TensorCodes, v: Tensor) -> tuple[TensorCodes, TensorCodes]:
        end = self.local_end
        return (self.k[lo:end], self.descale[0:1]), (self.v[lo:end], self.descale[1:2])

    def reset(self) -> None:
        super().reset()
        self.descale.zero_()
