"""Attention through FlashAttention-3's forward kernels (opt-in: `attention="fa3"`, `"fa3_fp8"`).

The `fa3-fwd` wheel (0.0.3: FA3's forward kernels built on PyTorch's stable ABI for CUDA 13,
`from fa3_fwd_interface import flash_attn_func`; no backward, local window nor paged KV) takes
q, k, v as [B, S, H, D]: the fast block's own layout, so neither the chunk's rows nor the
session's cache are transposed or copied for it (only the last dimension must be contiguous).
Measured on one H100 (issue 44): one chunk's queries against the served window's 22620 keys,
bf16 700 TFLOP/s against cuDNN SDPA's 630 with the same error; FP8 930 against the cuDNN FP8
graph's 839 with a third less error (FA3 writes O in bf16, the cuDNN graph in e4m3).

bf16 ("fa3"): exact attention like cuDNN's (a different kernel: rounding differs, not the math).

FP8 ("fa3_fp8", the self-attention; the cross-attention runs "fa3" in bf16): Q, K and V as e4m3
codes with float32 descales of shape [B, H_kv] (one per batch row and KV head), S = Q K^T
q_descale k_descale / sqrt(D) in float32, O = softmax(S) V v_descale written in bf16. The
project's FP8 operands carry one descale per tensor ([1]: the code cache's running descale per
layer and tensor, model/dit/kv_codes.py; Q and K's bound scales; `quantize_operand`'s per-call
amax): coarser than FA3's granularity, so each maps exactly, broadcast to every (batch, head)
(`head_descales`). The codes are read as they are: nothing requantized. O comes in bf16, so an
FP8 output projection quantizes it per row as any input (no dequantization pass; cuDNN's graph
instead writes O as e4m3 codes with one scale, Hopper's only choice there).

`available` says whether it can run here: sm_90 (FA3's kernels are Hopper's) with the wheel
importable (a CUDA 12 torch lacks the libcudart.so.13 it links: not importable).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from model.accel.fp8_attention import quantize_operand
from model.dit.e4m3 import E4M3, TensorCodes

CAPABILITY = (9, 0)  # Hopper: FA3's wgmma / TMA kernels


@functools.cache
def importable() -> bool:
    """Whether `fa3_fwd_interface` imports (tried once per process)."""
    try:
        import fa3_fwd_interface  # noqa: F401  (registers the fa3_fwd ops)
    except Exception:  # noqa: BLE001  not installed; built for another CUDA / torch (ImportError, OSError, ...)
        return False
    return True


def available(device: torch.device | str) -> bool:
    """Whether `attention="fa3"` / `"fa3_fp8"` can run on `device` (CUDA sm_90, fa3-fwd importable)."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device) == CAPABILITY and importable())


def _call(q: Tensor, k: Tensor, v: Tensor, **descales: Tensor) -> Tensor:
    from fa3_fwd_interface import flash_attn_func

    out = flash_attn_func(q, k, v, **descales)
    return out[0] if isinstance(out, tuple) else out  # (out, lse) with return_attn_probs


def attend_fa3(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention: [1, S, H, D] x [1, n, H, D] -> [1, S, H*D] (softmax scale 1/sqrt(D))."""
    return _call(q, k, v).flatten(2)


def head_descales(descales: Sequence[Tensor], batch: int, heads: int) -> list[Tensor]:
    """Per-tensor descales ([1] each) as FA3's [batch, heads] float32, each contiguous (one
    `cat` of broadcast views: a launch, no host sync; the values stay on the device)."""
    flat = torch.cat([d.float().reshape(1).expand(batch * heads) for d in descales])
    return list(flat.view(len(descales), batch, heads).unbind(0))


class Fa3Fp8Attention:
    """Unmasked FP8 attention through FA3: q [1, S, H, D], k and v [1, n, H, D], each bf16
    (quantized here, per tensor) or (e4m3 codes, descale [1]) -> O [1, S, H*D] in `dtype`
    (FA3 writes bf16; by default q's dtype, bf16 when q comes as codes)."""

    returns_codes = False  # O in bf16: an FP8 output projection quantizes it (cuDNN's: e4m3 codes)

    def __call__(self, q: Tensor | TensorCodes, k: Tensor | TensorCodes, v: Tensor | TensorCodes,
                 dtype: torch.dtype | None = None) -> Tensor:
        if dtype is None:
            dtype = torch.bfloat16 if isinstance(q, tuple) else q.dtype
        (qc, dq), (kc, dk), (vc, dv) = (x if isinstance(x, tuple) else quantize_operand(x) for x in (q, k, v))
        b, s, h, d = qc.shape
        n = kc.shape[1]
        assert kc.shape == vc.shape == (b, n, h, d), (qc.shape, kc.shape, vc.shape)
        assert qc.dtype == kc.dtype == vc.dtype == E4M3, (qc.dtype, kc.dtype, vc.dtype)
        assert dq.numel() == dk.numel() == dv.numel() == 1, (dq.shape, dk.shape, dv.shape)  # per tensor
        q_descale, k_descale, v_descale = head_descales((dq, dk, dv), b, h)
        out = _call(qc, kc, vc, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        return out.flatten(2).to(dtype)
