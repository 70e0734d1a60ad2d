"""Per-tensor e4m3 quantization in two passes at memory speed (CUDA, Triton): `fp8_attention`'s
Q, K and V (cuDNN's FP8 SDPA takes one descale per tensor).

`quantize_tensor(x)`: pass 1 reduces |x| to one float32 amax (one atomic max per program into
a zeroed cell), pass 2 writes codes = clamp(x * 448 / max(amax, floor)) in e4m3 and, from its
first program, the descale max(amax, floor) / 448: no host sync, nothing but x read twice and
the codes written. Same function as `fp8_attention.quantize_tensor`'s torch form, with the
reciprocal multiply instead of the division (a code may differ at an e4m3 rounding boundary).
torch.compile with dynamic shapes (a session's key length grows per chunk) made the reduction
a single program: 0.46-1.22 ms per call for Q, K and V on the H200, where the bytes allow ~0.4.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX

BLOCK = 8192  # elements per program (16 KiB of bf16)


@triton.jit
def _abs_max(x_ptr, amax_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))


@triton.jit
def _quantize_by_amax(x_ptr, amax_ptr, q_ptr, descale_ptr, N, BLOCK: tl.constexpr, FLOOR: tl.constexpr,
                      QMAX: tl.constexpr):
    pid = tl.program_id(0)
    amax = tl.maximum(tl.load(amax_ptr), FLOOR)
    if pid == 0:
        tl.store(descale_ptr, amax / QMAX)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(x * (QMAX / amax), -QMAX), QMAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


def quantize_tensor(x: torch.Tensor, codes: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """x (contiguous) -> (codes of x's shape, float32 descale [1]); `codes` float32 keeps the
    clamped products unrounded (the interpreter tests)."""
    assert x.is_contiguous()
    n = x.numel()
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    q = torch.empty(x.shape, dtype=codes, device=x.device)
    descale = torch.empty(1, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, BLOCK),)
    _abs_max[grid](x, amax, n, BLOCK=BLOCK, num_warps=8)
    _quantize_by_amax[grid](x, amax, q, descale, n, BLOCK=BLOCK, FLOOR=AMAX_FLOOR, QMAX=E4M3_MAX, num_warps=8)
    return q, descale


# The FP8 attention's code cache (model/dit/kv_codes.py): K and V of one DiT call go into their
# layer's e4m3 cache with one running descale per tensor. Each kernel handles K (program_id(1)
# 0) and V (1) in one launch (a grid of one along that axis: the first pair of pointers alone);
# the descale cells are read by all three and written by the last.
ROWS, COLS = 8, 1024  # a block of the new rows: 8 rows x 1024 of their H*D elements
RESCALE_BLOCK = 16384  # codes per program of the rescale (its programs return at once unless it grows)


@triton.jit
def _rows_abs_max(k_ptr, v_ptr, amax_ptr, L, C, stride_k, stride_v, ROWS: tl.constexpr, COLS: tl.constexpr):
    which = tl.program_id(1)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(2) * COLS + tl.arange(0, COLS)
    mask = (rows[:, None] < L) & (cols[None, :] < C)
    if which == 0:
        x = tl.load(k_ptr + rows[:, None].to(tl.int64) * stride_k + cols[None, :], mask=mask, other=0.0)
    else:
        x = tl.load(v_ptr + rows[:, None].to(tl.int64) * stride_v + cols[None, :], mask=mask, other=0.0)
    tl.atomic_max(amax_ptr + which, tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0))


@triton.jit
def _grown(descale_ptr, amax_ptr, which, FLOOR: tl.constexpr, QMAX: tl.constexpr):
    old = tl.load(descale_ptr + which)
    return old, tl.maximum(old, tl.maximum(tl.load(amax_ptr + which), FLOOR) / QMAX)


@triton.jit
def _rescale_codes(ck_ptr, cv_ptr, descale_ptr, amax_ptr, N, BLOCK: tl.constexpr, FLOOR: tl.constexpr,
                   QMAX: tl.constexpr):
    which = tl.program_id(1)
    old, new = _grown(descale_ptr, amax_ptr, which, FLOOR, QMAX)
    if old < new:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        ratio = old / new
        if which == 0:
            c = tl.load(ck_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(ck_ptr + offs, (c * ratio).to(ck_ptr.dtype.element_ty), mask=mask)
        else:
            c = tl.load(cv_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(cv_ptr + offs, (c * ratio).to(cv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_by(k_ptr, v_ptr, ck_ptr, cv_ptr, descale_ptr, amax_ptr, L, C, stride_k, stride_v,
                      ROWS: tl.constexpr, COLS: tl.constexpr, FLOOR: tl.constexpr, QMAX: tl.constexpr):
    # the descale is stored by the first program; a program that reads it after that computes the
    # same value (max is idempotent), so the order of programs does not matter
    which = tl.program_id(1)
    _, new = _grown(descale_ptr, amax_ptr, which, FLOOR, QMAX)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(2) * COLS + tl.arange(0, COLS)
    mask = (rows[:, None] < L) & (cols[None, :] < C)
    out = rows[:, None].to(tl.int64) * C + cols[None, :]
    if which == 0:
        x = tl.load(k_ptr + rows[:, None].to(tl.int64) * stride_k + cols[None, :], mask=mask, other=0.0)
        q = tl.minimum(tl.maximum(x.to(tl.float32) / new, -QMAX), QMAX)
        tl.store(ck_ptr + out, q.to(ck_ptr.dtype.element_ty), mask=mask)
    else:
        x = tl.load(v_ptr + rows[:, None].to(tl.int64) * stride_v + cols[None, :], mask=mask, other=0.0)
        q = tl.minimum(tl.maximum(x.to(tl.float32) / new, -QMAX), QMAX)
        tl.store(cv_ptr + out, q.to(cv_ptr.dtype.element_ty), mask=mask)
    if (tl.program_id(0) == 0) & (tl.program_id(2) == 0):
        tl.store(descale_ptr + which, new)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[L, H, D] (rows of H*D elements, contiguous within a row) as [L, H*D] and its row stride."""
    flat = x.flatten(1)
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    return flat, flat.stride(0)


def append_codes(codes: tuple[torch.Tensor, ...], descale: torch.Tensor, new: tuple[torch.Tensor, ...], start: int,
                 rescale: int | None = None) -> torch.Tensor:
    """model/dit/kv_codes.py append_codes_reference in four launches (a memset and three kernels) for K
    and V together (or one tensor alone: the V of a cache whose K comes coded): the new rows read
    twice (amax, codes), the cached codes [0, rescale) (default: [0, start)) only when the descale
    grew. `codes` are contiguous [cap, H, D] caches; `new` rows may be strided views. Returns the
    new rows' amax per tensor (float32 [1 or 2], on the device: the code cache's growth record)."""
    assert len(codes) == len(new) == descale.shape[0] in (1, 2) and descale.is_contiguous()
    (k, stride_k), (v, stride_v) = _rows(new[0]), _rows(new[-1])
    ck, cv = codes[0], codes[-1]
    assert ck.is_contiguous() and cv.is_contiguous() and k.shape == v.shape
    L, C = k.shape
    tensors = len(codes)
    amax = torch.zeros(tensors, dtype=torch.float32, device=k.device)
    grid = (triton.cdiv(L, ROWS), tensors, triton.cdiv(C, COLS))
    _rows_abs_max[grid](k, v, amax, L, C, stride_k, stride_v, ROWS=ROWS, COLS=COLS, num_warps=4)
    rescale = start if rescale is None else rescale
    if rescale:
        n = rescale * C
        _rescale_codes[(triton.cdiv(n, RESCALE_BLOCK), tensors)](ck, cv, descale, amax, n, BLOCK=RESCALE_BLOCK,
                                                                 FLOOR=AMAX_FLOOR, QMAX=E4M3_MAX, num_warps=8)
    _quantize_rows_by[grid](k, v, ck[start:], cv[start:], descale, amax, L, C, stride_k, stride_v, ROWS=ROWS,
                            COLS=COLS, FLOOR=AMAX_FLOOR, QMAX=E4M3_MAX, num_warps=4)
    return amax
