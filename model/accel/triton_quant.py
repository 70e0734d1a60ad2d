"""FP8 GEMM inputs quantized per row in one pass (CUDA, Triton): `kernels.quantize_rows`,
`kernels.gelu_quantize` and the three norm regions that feed a GEMM (`modulated_norm_q`,
`attn_camera_norm_q`, `cross_residual_norm_q`) as single-read kernels.

torch.compile makes both a looped reduction over rows of 5120 / 13824 elements: one pass for
the row's amax and a second one, reading the row again, for the output (and the GELU computed
twice); on the H200 that ran at a third of the memory bandwidth (225 µs for the FFN's
[4524, 13824] activation, `benchmarks/results/h200_round2_profile_fp8.txt`). Here one program
holds one row in registers: one read, one e4m3 write, one scale.

The norm regions: residual add, camera modulation, LayerNorm statistics (float32, biased
variance), modulation or affine, the rounding to the compute dtype and the row's quantization,
from one read of each input row; the new residual is written once (float32).

Same function as the eager versions up to rounding: the GELU (tanh form, float32) is rounded
to the input's dtype before its amax, as `F.gelu` on a bf16 tensor returns it; the scale is
max(amax, 1e-12) / 448 and the quotient is clamped to ±448 before the e4m3 conversion.

Launch knobs (`Launch`): the warps per program, and `reciprocal`: codes as v * (QMAX / amax)
instead of the IEEE-rounded quotient v / scale (one multiply instead of a division per element;
a code may differ where the quotient sits at an e4m3 rounding boundary). The functions' default
is the first measured launch (MEASURED); `TUNED` holds each kernel's fastest launch from
`benchmarks/quant_probe.py` (the division made them issue-bound), which the DiT runs.

Only imported on CUDA with Triton (`BlockKernels.build(..., triton_quant=True)`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX, QuantizedRows

SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a kernel reads only constexpr globals
GELU_KAPPA = tl.constexpr(0.044715)


@dataclass(frozen=True)
class Launch:
    """How a kernel is launched: `num_warps` None = 8 for rows of 8192+ elements, else 4."""
    num_warps: int | None = None
    reciprocal: bool = False

    def warps(self, block: int) -> int:
        return self.num_warps or (8 if block >= 8192 else 4)


MEASURED = Launch()  # the first launch measured in the DiT (round 2): IEEE division, the default warps

# The fastest launch of each kernel at the DiT's shapes (one chunk at 464x832: 4524 rows of 5120,
# the FFN's 13824), on the H200 (`python -m benchmarks.quant_probe`, results in
# benchmarks/results/h200_round2_quant_probe.json): with the reciprocal every kernel beats the
# compiled region it replaces (GELU 205 -> 87 us, modulated norm 124 -> 58, attention + camera
# norm 129 -> 111, cross residual norm 105 -> 85), without it three of the five did not.
# `quantize_rows` has none: the compiled function is as fast (39 against 41 us) with exact codes.
TUNED: dict[str, Launch] = {
    "gelu_quantize": Launch(8, reciprocal=True),
    "modulated_norm_q": Launch(None, reciprocal=True),
    "attn_camera_norm_q": Launch(4, reciprocal=True),
    "cross_residual_norm_q": Launch(4, reciprocal=True),
}


def tuned(name: str) -> Callable[..., object]:
    """The kernel function `name` with its TUNED launch."""
    return partial(globals()[name], launch=TUNED[name])


@triton.jit
def _store_quantized(v, mask, offs, row, q_ptr, s_ptr, stride_q, FLOOR: tl.constexpr, QMAX: tl.constexpr,
                     RECIPROCAL: tl.constexpr):
    """One row's e4m3 codes and scale: scale = max(amax, FLOOR) / QMAX, codes = v / scale
    (RECIPROCAL: v * (QMAX / max(amax, FLOOR)))."""
    amax = tl.maximum(tl.max(tl.where(mask, tl.abs(v), 0.0), axis=0), FLOOR)
    scale = amax / QMAX
    if RECIPROCAL:
        q = tl.clamp(v * (QMAX / amax), -QMAX, QMAX)
    else:
        q = tl.clamp(tl.div_rn(v, scale), -QMAX, QMAX)
    tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


@triton.jit
def _quantize_rows(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, GELU: tl.constexpr, BLOCK: tl.constexpr,
                   FLOOR: tl.constexpr, QMAX: tl.constexpr, RECIPROCAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    if GELU:
        inner = SQRT_2_OVER_PI * (xf + GELU_KAPPA * xf * xf * xf)
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)  # saturates to ±1 for large |inner|
        xf = (0.5 * xf * (1.0 + tanh)).to(x.dtype).to(tl.float32)  # F.gelu's output dtype
    _store_quantized(xf, mask, offs, row, q_ptr, s_ptr, stride_q, FLOOR, QMAX, RECIPROCAL)


@triton.jit
def _norm_quantize(x_ptr, y_ptr, gate_ptr, cs_ptr, csh_ptr, xo_ptr, w_ptr, b_ptr, q_ptr, s_ptr, K, eps,
                   stride_x, stride_y, stride_cs, stride_xo, stride_q,
                   HAS_Y: tl.constexpr, HAS_GATE: tl.constexpr, HAS_CAM: tl.constexpr, WRITE_X: tl.constexpr,
                   MODULATE: tl.constexpr, ROUND_NORM: tl.constexpr, OUT_BF16: tl.constexpr,
                   BLOCK: tl.constexpr, FLOOR: tl.constexpr, QMAX: tl.constexpr, RECIPROCAL: tl.constexpr):
    """One row: x (+ y * gate) (* cam_scale + cam_shift) -> written back when WRITE_X; then
    LN(x) * (1 + w) + b (MODULATE: w, b are scale, shift) or LN(x) * w + b (affine), rounded to
    the compute dtype, quantized."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x_raw = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    x = x_raw.to(tl.float32)
    if HAS_Y:
        y = tl.load(y_ptr + row * stride_y + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            y = y * tl.load(gate_ptr + offs, mask=mask, other=0.0)
        x = x + y
    if HAS_CAM:
        cs = tl.load(cs_ptr + row * stride_cs + offs, mask=mask, other=0.0).to(tl.float32)
        csh = tl.load(csh_ptr + row * stride_cs + offs, mask=mask, other=0.0).to(tl.float32)
        x = cs * x + csh
    if WRITE_X:
        tl.store(xo_ptr + row * stride_xo + offs, x, mask=mask)
    mean = tl.sum(x, axis=0) / K
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / K + eps)
    n = d * rstd
    if ROUND_NORM:  # layer_norm(x).type_as(x) on a 16-bit x
        n = n.to(x_raw.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    if MODULATE:
        out = n * (1.0 + w) + b
    else:
        out = n * w + b
    if OUT_BF16:
        out = out.to(tl.bfloat16).to(tl.float32)
    else:
        out = out.to(tl.float16).to(tl.float32)
    _store_quantized(out, mask, offs, row, q_ptr, s_ptr, stride_q, FLOOR, QMAX, RECIPROCAL)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[1, S, K] (or [S, K]) -> a 2-D view with unit column stride."""
    r = t.reshape(-1, t.shape[-1])
    return r if r.stride(-1) == 1 else r.contiguous()


def _vector(t: torch.Tensor, k: int) -> torch.Tensor:
    """A per-column vector ([1, 1, K] or [K]) as a contiguous float32 [K]."""
    assert t.numel() == k, f"expected one value per column, got shape {tuple(t.shape)}"
    return t.reshape(k).float().contiguous()


def _norm_launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, dtype: torch.dtype, *,
                 modulate: bool, y: torch.Tensor | None = None, gate: torch.Tensor | None = None,
                 cam: tuple[torch.Tensor, torch.Tensor] | None = None,
                 write_x: bool = False, codes: torch.dtype = torch.float8_e4m3fn, launch: Launch = MEASURED
                 ) -> tuple[torch.Tensor | None, QuantizedRows]:
    k = x.shape[-1]
    xr = _rows(x)
    m = xr.shape[0]
    yr = _rows(y) if y is not None else xr
    cs, csh = (_rows(cam[0]), _rows(cam[1])) if cam is not None else (xr, xr)
    assert cam is None or cs.stride(0) == csh.stride(0)
    x_out = torch.empty((m, k), dtype=torch.float32, device=x.device) if write_x else None
    q = torch.empty((m, k), dtype=codes, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    gate_v = _vector(gate, k) if gate is not None else scale
    block = triton.next_power_of_2(k)
    _norm_quantize[(m,)](
        xr, yr, gate_v, cs, csh, x_out if write_x else q, _vector(w, k), _vector(b, k), q, scale, k, eps,
        xr.stride(0), yr.stride(0), cs.stride(0), x_out.stride(0) if write_x else 0, q.stride(0),
        HAS_Y=y is not None, HAS_GATE=gate is not None, HAS_CAM=cam is not None, WRITE_X=write_x,
        MODULATE=modulate, ROUND_NORM=x.dtype != torch.float32 and not write_x, OUT_BF16=dtype == torch.bfloat16,
        BLOCK=block, FLOOR=AMAX_FLOOR, QMAX=E4M3_MAX, RECIPROCAL=launch.reciprocal, num_warps=launch.warps(block))
    lead = x.shape[:-1]
    return (x_out.view(*lead, k) if write_x else None), (q.view(*lead, k), scale.view(*lead, 1))


def modulated_norm_q(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float,
                     dtype: torch.dtype, launch: Launch = MEASURED) -> QuantizedRows:
    """kernels.modulated_norm_q."""
    return _norm_launch(x, scale, shift, eps, dtype, modulate=True, launch=launch)[1]


def attn_camera_norm_q(x: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor, cam_scale: torch.Tensor,
                       cam_shift: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor, eps: float,
                       dtype: torch.dtype, launch: Launch = MEASURED) -> tuple[torch.Tensor, QuantizedRows]:
    """kernels.attn_camera_norm_q (the residual comes back in float32, as the gate promotes it)."""
    x_out, q = _norm_launch(x, norm_weight, norm_bias, eps, dtype, modulate=False, y=attn, gate=gate,
                            cam=(cam_scale, cam_shift), write_x=True, launch=launch)
    return x_out, q


def cross_residual_norm_q(x: torch.Tensor, cross: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                          eps: float, dtype: torch.dtype, launch: Launch = MEASURED
                          ) -> tuple[torch.Tensor, QuantizedRows]:
    """kernels.cross_residual_norm_q for a float32 residual (the fast block's after its first
    residual add)."""
    assert x.dtype == torch.float32, "the fused cross residual + norm takes a float32 residual"
    x_out, q = _norm_launch(x, scale, shift, eps, dtype, modulate=True, y=cross, write_x=True, launch=launch)
    return x_out, q


def _launch(x: torch.Tensor, gelu: bool, codes: torch.dtype = torch.float8_e4m3fn,
            launch: Launch = MEASURED) -> QuantizedRows:
    """`codes` float32 keeps the clamped quotients unrounded (the interpreter tests: Triton's
    interpreter does not round to e4m3 as the hardware does)."""
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    q = torch.empty(rows.shape, dtype=codes, device=x.device)
    scale = torch.empty((rows.shape[0], 1), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    _quantize_rows[(rows.shape[0],)](rows, q, scale, k, rows.stride(0), q.stride(0), GELU=gelu, BLOCK=block,
                                     FLOOR=AMAX_FLOOR, QMAX=E4M3_MAX, RECIPROCAL=launch.reciprocal,
                                     num_warps=launch.warps(block))
    return q.view(x.shape), scale.view(*x.shape[:-1], 1)


def quantize_rows(x: torch.Tensor, launch: Launch = MEASURED) -> QuantizedRows:
    """x [..., K] -> (float8_e4m3fn [..., K], float32 scales [..., 1]), as kernels.quantize_rows."""
    return _launch(x, gelu=False, launch=launch)


def gelu_quantize(y: torch.Tensor, launch: Launch = MEASURED) -> QuantizedRows:
    """quantize_rows(gelu_tanh(y)) with y read once, as kernels.gelu_quantize."""
    return _launch(y, gelu=True, launch=launch)
