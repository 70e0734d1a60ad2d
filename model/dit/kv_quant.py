"""FP8 storage for the self-attention KV cache (opt-in: `ModelArgs.kv_cache: fp8`).

Keys and values are stored as float8 e4m3 with one float32 scale per token and head (the
amax of its head_dim row / 448, so no element saturates), which halves the cache of a
full-attention session (bf16: 2 bytes per element; here 1 + 8 / head_dim). They are written
once per DiT call and read back in the compute dtype for attention: the chunk being computed
attends to its own keys and values exactly (they are never rounded), to the past through the
FP8 copy. The numerics change (reported by `benchmarks/capacity.py`); the default cache keeps
the compute dtype and is bit-exact.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from model.dit.e4m3 import E4M3, E4M3_MAX

SCALE_DTYPE = torch.float32
_TINY = 1e-12  # the scale of an all-zero row (any positive value dequantises it to zero)


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / E4M3_MAX).clamp_min(_TINY)
    return (xf / scale[..., None]).to(E4M3), scale


def _dequantize_into(out: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    out.copy_(q.to(out.dtype) * scale[..., None].to(out.dtype))


# On CUDA each is one fused kernel (torch.compile, the token count dynamic: no recompile per
# chunk); eager they are 5 and 2 passes over the data. The same function up to rounding.
# A compilation that fails (an old Triton without float8) falls back to eager, loudly, once.
_compiled: dict[str, Callable] = {}
_log = logging.getLogger("model.dit.kv_quant")


def compiled_on_cuda(name: str, fn: Callable) -> Callable:
    if name not in _compiled:
        compiled = torch.compile(fn, dynamic=True, fullgraph=True)

        def first_call(*args):
            try:
                out = compiled(*args)
                _compiled[name] = compiled
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - the eager function computes the same
                _log.warning("FP8 KV %s: compiling failed (%s: %s); eager from now on", name, type(e).__name__, e)
                _compiled[name] = fn
                out = fn(*args)
            return out

        _compiled[name] = first_call
    return _compiled[name]


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, H, D] -> (float8 [L, H, D], float32 scales [L, H]) with x ~= q * scale."""
    return (compiled_on_cuda("quantize", _quantize) if x.is_cuda else _quantize)(x)


def dequantize_into(out: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """out[...] = q * scale in out's dtype (out: [n, H, D], q: float8 [n, H, D], scale: [n, H])."""
    (compiled_on_cuda("dequantize", _dequantize_into) if q.is_cuda else _dequantize_into)(out, q, scale)
