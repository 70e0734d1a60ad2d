"""The self-attention's Q / K RMSNorm + RoPE as one Triton pass per row (CUDA with Triton;
`AccelOptions.triton_rope`, on in the serving options): `kernels.qk_norm_rope` and `qk_norm_rope_codes`.

One program holds one token's row of `dim` elements as pairs [dim / 2, 2] in registers: the sum
of squares, the normalized row rounded to the input's dtype and times the weight (rounded again),
each pair rotated by its token's cos / sin (float32) and rounded to the input's dtype, then
written as it is or as e4m3 codes with a fixed descale (the bound scales). The row is read once
and written once. The compiled region does the same work in a looped reduction that reads the row
twice plus a strided RoPE pass: 84 us per call for [4524, 5120] on the H200 where the bytes allow
~22 (docs/PERFORMANCE.md, session 7).

At the DiT's width the row goes through in five blocks of 512 pairs instead (`_norm_rope_looped`:
no masked lanes, fewer registers; the second pass rereads the row from L1): 34 us against 41
(session 8).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from model.dit.e4m3 import E4M3_MAX

WARPS = 8
# The looped kernel's pairs per block where they tile the row and hold whole heads (session 8 on
# an H200, [4524, 5120] rows: 34 us per call with 8 warps against 41 for the one-block kernel;
# 2 or 4 warps 49-56 us; benchmarks.quant_probe --only rope).
LOOP_BLOCK = 512


@triton.jit
def _rotate_store(x, rstd, w, c, s, dst, mask, descale_ptr, DTYPE: tl.constexpr, CODES: tl.constexpr,
                  QMAX: tl.constexpr):
    """Pairs [n, 2] of a row (float32) -> normalized (rounded to DTYPE as type_as(t)), times the
    weight (rounded again), rotated by cos / sin [n] (rounded), stored at `dst` as they are or as
    codes of the fixed descale."""
    n = (x * rstd).to(DTYPE).to(tl.float32)
    n = (n * w).to(DTYPE).to(tl.float32)
    a, b = tl.split(n)  # the pairs' first and second elements
    r = tl.join(a * c - b * s, a * s + b * c).to(DTYPE)
    if CODES:
        q = tl.minimum(tl.maximum(r.to(tl.float32) / tl.load(descale_ptr), -QMAX), QMAX)
        tl.store(dst, q.to(dst.dtype.element_ty), mask=mask)
    else:
        tl.store(dst, r, mask=mask)


@triton.jit
def _norm_rope(t_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, descale_ptr, stride_t, eps,
               DIM: tl.constexpr, HALF_D: tl.constexpr, PAIRS: tl.constexpr, CODES: tl.constexpr,
               QMAX: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, PAIRS)  # pair index within the row
    offs = 2 * p[:, None] + tl.arange(0, 2)[None, :]  # [PAIRS, 2]: the row's elements
    mask = offs < DIM
    x = tl.load(t_ptr + row * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(tl.sum(x * x, axis=1), axis=0) / DIM + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    j = row * HALF_D + p % HALF_D  # the pair's frequency within its head
    pmask = p < DIM // 2
    c = tl.load(cos_ptr + j, mask=pmask, other=0.0)
    s = tl.load(sin_ptr + j, mask=pmask, other=0.0)
    _rotate_store(x, rstd, w, c, s, out_ptr + row * DIM + offs, mask, descale_ptr, t_ptr.dtype.element_ty,
                  CODES, QMAX)


@triton.jit
def _norm_rope_looped(t_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, descale_ptr, stride_t, eps,
                      DIM: tl.constexpr, HALF_D: tl.constexpr, BLOCK: tl.constexpr, CODES: tl.constexpr,
                      QMAX: tl.constexpr):
    """_norm_rope over the row in blocks of BLOCK pairs (BLOCK divides dim / 2 and is a multiple
    of HALF_D): no masked lanes, fewer registers per program; the second pass rereads the row
    (10 KB at the DiT's width) from L1 / L2."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, BLOCK)
    offs = 2 * p[:, None] + tl.arange(0, 2)[None, :]  # [BLOCK, 2]
    src = t_ptr + row * stride_t
    ss = tl.zeros((BLOCK, 2), dtype=tl.float32)
    for start in tl.static_range(0, DIM, 2 * BLOCK):
        x = tl.load(src + start + offs).to(tl.float32)
        ss += x * x
    rstd = tl.math.rsqrt(tl.sum(tl.sum(ss, axis=1), axis=0) / DIM + eps)
    j = row * HALF_D + p % HALF_D  # the same frequencies in every block (BLOCK % HALF_D == 0)
    c = tl.load(cos_ptr + j)
    s = tl.load(sin_ptr + j)
    for start in tl.static_range(0, DIM, 2 * BLOCK):
        x = tl.load(src + start + offs).to(tl.float32)
        w = tl.load(w_ptr + start + offs).to(tl.float32)
        _rotate_store(x, rstd, w, c, s, out_ptr + row * DIM + start + offs, None, descale_ptr,
                      t_ptr.dtype.element_ty, CODES, QMAX)


def _launch(t: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, heads: int,
            descale: torch.Tensor | None, codes: torch.dtype, block: int | None | str = "auto",
            warps: int = WARPS) -> torch.Tensor:
    """block: pairs per block of the looped kernel, None the one-block kernel, "auto" LOOP_BLOCK
    where it tiles the row into whole heads, else None."""
    *lead, dim = t.shape
    rows = t.reshape(-1, dim)  # a view for the fused projection's q / k slices (rows strided)
    assert rows.stride(1) == 1, "rows must be contiguous within a row"
    half = dim // heads // 2
    n = rows.shape[0]
    assert cos.shape == sin.shape == (n, 1, half) and cos.dtype == sin.dtype == torch.float32
    assert weight.shape == (dim,) and dim % 2 == 0
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(*lead, heads, dim // heads, dtype=t.dtype if descale is None else codes, device=t.device)
    args = (rows, weight, cos, sin, out, descale if descale is not None else cos, rows.stride(0), eps)
    if block == "auto":
        block = LOOP_BLOCK if (dim // 2) % LOOP_BLOCK == 0 and LOOP_BLOCK % half == 0 else None
    if block is None:
        _norm_rope[(n,)](*args, DIM=dim, HALF_D=half, PAIRS=triton.next_power_of_2(dim // 2),
                         CODES=descale is not None, QMAX=E4M3_MAX, num_warps=warps)
    else:
        assert (dim // 2) % block == 0 and block % half == 0, (dim, block, half)
        _norm_rope_looped[(n,)](*args, DIM=dim, HALF_D=half, BLOCK=block, CODES=descale is not None,
                                QMAX=E4M3_MAX, num_warps=warps)
    return out


def qk_norm_rope(t: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                 heads: int) -> torch.Tensor:
    """`kernels.qk_norm_rope`: [..., dim] -> [..., heads, head_dim] in t's dtype."""
    return _launch(t, weight, cos, sin, eps, heads, None, t.dtype)


def qk_norm_rope_codes(t: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                       heads: int, descale: torch.Tensor, codes: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """`kernels.qk_norm_rope_codes`; `codes` float32 keeps the quotients unrounded (the tests)."""
    return _launch(t, weight, cos, sin, eps, heads, descale, codes)
