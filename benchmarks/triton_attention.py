"""Unmasked attention as one Triton kernel (Hopper: TMA loads, wgmma), bf16 or FP8: an
experiment of issue 18, measured slower than cuDNN's bf16 attention in both modes (numbers in
docs/PERFORMANCE.md, round 2; `benchmarks/attention_probe.py` reruns them), so the model does not
use it. Kept for the next attempt (FP8 attention reading the FP8 KV cache without a per-call
quantisation of K and V).

    out = attention(q, k, v)            # q [S, H, D], k/v [n, H, D] (rows contiguous) -> [S, H*D]
    out = attention(q, k, v, fp8=True)  # Q·K^T and P·V in float8 e4m3 (changed numerics)

The exact (bf16) kernel is FlashAttention-2's forward: per program 128 query rows of one head,
an online softmax over key blocks in float32, P rounded to the compute dtype before P·V (as
cuDNN's and FlashAttention's kernels do). The scale 1/sqrt(D) is folded into the exp2.

FP8: q and k are quantised per (token, head) to e4m3 (scale = amax / 448) inside the kernel
loop's operands, the score tile rescaled by the two scale vectors in float32; P (in [0, 1]) is
quantised with the fixed scale 448 and V per head (its amax over the visible tokens), so P·V
runs on e4m3 tensor cores too. V is handed to the kernel transposed ([H*D, n]) because an e4m3
wgmma takes its B operand K-major.

Layout: everything is addressed as 2-D row-major matrices [tokens, H*D] (the fast block's q,
the KV cache's [n, H, D] slices are such views); a head is a column block of width D. The
tensor descriptors handle ragged edges (rows past S or n read as zeros, stores are clipped);
the last key block masks its missing columns to -inf.

Needs Triton and a CUDA device (Hopper).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from model.dit import kv_quant
from model.dit.e4m3 import E4M3_MAX

LOG2E = 1.4426950408889634


# Tile configuration per (dtype, head_dim): measured on one H200 (benchmarks/attention_probe.py).
CONFIGS: dict[tuple[str, int], dict[str, int]] = {
    ("bf16", 128): {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
    ("fp8", 128): {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
}


@triton.jit
def _softmax_step(qk, m_i, l_i, acc, qk_scale):
    """One online-softmax update with the score tile qk (float32, unscaled)."""
    m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_ij, l_i, acc


@triton.jit
def _attn_fwd(desc_q, desc_k, desc_v, desc_o, N, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    col = tl.program_id(1) * HEAD_DIM
    q = desc_q.load([m0, col])
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for n0 in tl.range(0, n_full, BLOCK_N):
        k = desc_k.load([n0, col])
        qk = tl.dot(q, k.T)
        p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale)
        v = desc_v.load([n0, col])
        acc = tl.dot(p.to(v.dtype), v, acc)
    if n_full < N:  # the ragged last block: its missing keys get no weight
        k = desc_k.load([n_full, col])
        qk = tl.dot(q, k.T)
        cols = n_full + tl.arange(0, BLOCK_N)
        qk = tl.where(cols[None, :] < N, qk, -float("inf"))
        p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale)
        v = desc_v.load([n_full, col])
        acc = tl.dot(p.to(v.dtype), v, acc)
    desc_o.store([m0, col], (acc / l_i[:, None]).to(q.dtype))


@triton.jit
def _fp8_block(q, sq, desc_k, desc_vt, k_scale, n0, col, h, H, N, m_i, l_i, acc, qk_scale,
               BLOCK_N: tl.constexpr, RAGGED: tl.constexpr):
    cols = n0 + tl.arange(0, BLOCK_N)
    k = desc_k.load([n0, col])
    if RAGGED:
        sk = tl.load(k_scale + cols * H + h, mask=cols < N, other=0.0)
    else:
        sk = tl.load(k_scale + cols * H + h)
    qk = tl.dot(q, k.T) * sq[:, None] * sk[None, :]
    if RAGGED:
        qk = tl.where(cols[None, :] < N, qk, -float("inf"))
    p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale)
    vt = desc_vt.load([col, n0])  # [D, BLOCK_N]
    acc = tl.dot((p * 448.0).to(tl.float8e4nv), vt.T, acc)
    return m_i, l_i, acc


@triton.jit
def _attn_fwd_fp8(desc_q, desc_k, desc_vt, desc_o, q_scale, k_scale, v_scale, S, N, H, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """As _attn_fwd on e4m3 operands: q/k scaled per (token, head) ([S, H], [N, H] float32),
    V^T [H*D, N] per head (v_scale [H]); P quantised as p * 448 (E4M3_MAX)."""
    m0 = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    col = h * HEAD_DIM
    rows = m0 + tl.arange(0, BLOCK_M)
    q = desc_q.load([m0, col])
    sq = tl.load(q_scale + rows * H + h, mask=rows < S, other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    for n0 in tl.range(0, n_full, BLOCK_N):
        m_i, l_i, acc = _fp8_block(q, sq, desc_k, desc_vt, k_scale, n0, col, h, H, N, m_i, l_i, acc,
                                   qk_scale, BLOCK_N, False)
    if n_full < N:
        m_i, l_i, acc = _fp8_block(q, sq, desc_k, desc_vt, k_scale, n_full, col, h, H, N, m_i, l_i, acc,
                                   qk_scale, BLOCK_N, True)
    sv = tl.load(v_scale + h)
    out = acc * (sv / 448.0) / l_i[:, None]
    desc_o.store([m0, col], out.to(tl.bfloat16))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[L, H, D] with contiguous rows -> the [L, H*D] matrix view."""
    if t.stride(2) != 1 or t.stride(1) != t.shape[2] or t.stride(0) % 8:
        t = t.contiguous()
    return t.as_strided((t.shape[0], t.shape[1] * t.shape[2]), (t.stride(0), 1))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: bool = False,
              config: dict[str, int] | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v per head: q [S, H, D], k/v [n, H, D] -> [S, H*D] in q's dtype."""
    S, H, D = q.shape
    n = k.shape[0]
    cfg = dict(config or CONFIGS[("fp8" if fp8 else "bf16", D)])
    bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    out = torch.empty(S, H * D, device=q.device, dtype=torch.bfloat16 if fp8 else q.dtype)
    qk_scale = LOG2E / math.sqrt(D)
    grid = (triton.cdiv(S, bm), H)
    d_o = TensorDescriptor.from_tensor(out, [bm, D])
    if not fp8:
        q2, k2, v2 = _rows(q), _rows(k.to(q.dtype)), _rows(v.to(q.dtype))
        _attn_fwd[grid](TensorDescriptor.from_tensor(q2, [bm, D]), TensorDescriptor.from_tensor(k2, [bn, D]),
                        TensorDescriptor.from_tensor(v2, [bn, D]), d_o, n, qk_scale,
                        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, **cfg)
        return out
    qq, sq = quantize_heads(q)
    kq, sk = quantize_heads(k)
    vt, sv = quantize_v_transposed(v)
    _attn_fwd_fp8[grid](TensorDescriptor.from_tensor(_rows(qq), [bm, D]),
                        TensorDescriptor.from_tensor(_rows(kq), [bn, D]),
                        TensorDescriptor.from_tensor(vt, [D, bn]), d_o, sq, sk, sv, S, n, H, qk_scale,
                        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, **cfg)
    return out


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, H, D] -> (e4m3 [L, H, D], float32 scales [L, H]): one scale per token and head (the
    FP8 KV cache's format and fused kernel, model/dit/kv_quant.py)."""
    return kv_quant.quantize(x)


def _v_scales(v: torch.Tensor) -> torch.Tensor:
    return (v.float().abs().amax(dim=(0, 2)) / E4M3_MAX).clamp_min(1e-12)  # [H]


def _v_transposed_into(out: torch.Tensor, v: torch.Tensor, scale: torch.Tensor) -> None:
    n, H, D = v.shape
    out.copy_((v.float() / scale[None, :, None]).to(torch.float8_e4m3fn).flatten(1).t())


def quantize_v_transposed(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v [n, H, D] -> (e4m3 V^T [H*D, n] (rows padded to 16 bytes for the descriptor), scales [H])."""
    n, H, D = v.shape
    scale = kv_quant.compiled_on_cuda("v_scales", _v_scales)(v)
    n_pad = -(-n // 16) * 16
    vt = torch.empty(H * D, n_pad, device=v.device, dtype=torch.float8_e4m3fn)[:, :n]
    kv_quant.compiled_on_cuda("v_transposed", _v_transposed_into)(vt, v, scale)
    return vt, scale
