"""Attention through FlashAttention's CuTe DSL kernels (opt-in: `attention="fa4"`).

The `flash-attn-4` wheel (pure Python, kernels JIT-compiled by NVIDIA's CUTLASS DSL; FA3-class
kernels on sm_90, FA4 on Blackwell) takes q, k, v as [B, S, H, D]: the fast block's own layout,
so neither the chunk's rows nor the session's cache are transposed or copied for it. Exact
attention in bf16 like cuDNN's (a different kernel: rounding differs, not the math); the
candidate for the bf16 attention lever of docs/PERFORMANCE.md (cuDNN runs the DiT's shapes at
545-640 TFLOP/s against GEMMs near 800). `available` says whether it can run here; the first
call per shape compiles the kernel.
"""
from __future__ import annotations

from importlib.util import find_spec

import torch
from torch import Tensor

MIN_CAPABILITY = (9, 0)  # measured for Hopper; Blackwell runs its own FA4 kernels


def available(device: torch.device | str) -> bool:
    """Whether `attention="fa4"` can run on `device` (CUDA sm_90+, flash-attn-4 installed)."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY
            and find_spec("flash_attn") is not None)


def attend_fa4(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention: [1, S, H, D] x [1, n, H, D] -> [1, S, H*D] (softmax scale 1/sqrt(D))."""
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v)
    return (out[0] if isinstance(out, tuple) else out).flatten(2)  # (out, lse) in recent versions
