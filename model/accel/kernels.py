"""The fast DiT block's elementwise regions and attention, as pure functions.

Each function computes what a stretch of `model/dit/block.py` computes, with the same casts
(so float32 results agree up to rounding), in one place that `torch.compile` can fuse into
one or two kernels instead of 5-10 eager passes over [1, S, dim]. RoPE math runs in the
table's dtype (float32 on the fast path).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.accel.fa3_attention import attend_fa3
from model.accel.fa4_attention import attend_fa4
from model.dit.block import layer_norm
from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX, QuantizedRows, TensorCodes  # AMAX_FLOOR: an all-zero row's scale is not 0

if TYPE_CHECKING:
    from model.accel.fa3_attention import Fa3Fp8Attention
    from model.accel.fp8_attention import CudnnFp8Attention

ROUNDING_MARGIN = 1.02  # rope_norm_bound's room for roundings

_BACKENDS: dict[str, list[SDPBackend] | None] = {
    "default": None,
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}
_BACKENDS["cudnn_fp8"] = _BACKENDS["cudnn"]  # the cross-attention's (the self-attention's is FP8)


def modulated_norm(x: Tensor, scale: Tensor, shift: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    """LN(x) (rounded to x's dtype) * (1 + scale) + shift, cast to the compute dtype."""
    return (layer_norm(x, eps).float() * (1 + scale) + shift).to(dtype)


def rms_norm(t: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the full width in float32, rounded to t's dtype, times weight."""
    tf = t.float()
    return (tf * torch.rsqrt(tf.pow(2).mean(dim=-1, keepdim=True) + eps)).type_as(t) * weight


def qk_norm_rope(t: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, heads: int) -> Tensor:
    """q or k [1, S, dim] -> RMSNorm, split into heads, rotate pairs -> [1, S, heads, head_dim].

    cos/sin [S, 1, head_dim/2] in the math dtype; the result has t's dtype.
    """
    n = rms_norm(t, weight, eps).unflatten(-1, (heads, -1))  # [1, S, H, D]
    pairs = n.to(cos.dtype).unflatten(-1, (-1, 2))  # [1, S, H, D/2, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # [1, S, H, D/2, 2]
    return rotated.flatten(-2).to(t.dtype)


def qk_norm_rope_codes(t: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, heads: int,
                       descale: Tensor) -> Tensor:
    """`qk_norm_rope` as float8_e4m3fn codes with a fixed descale [1] (the FP8 attention's bound
    scales, `rope_norm_bound`): the rotated bf16 value divided, clamped, rounded, in the same
    region (no bf16 [1, S, H, D] written for a quantization pass to read back twice)."""
    x = qk_norm_rope(t, weight, cos, sin, eps, heads)
    return (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def rope_norm_bound(weight: Tensor) -> float:
    """A bound on |qk_norm_rope(t, weight, ...)| for any t: RMSNorm makes sum_i n_i^2 <= dim, so
    each rotated pair of n_i w_i has a norm <= sqrt(dim) max|w|; times a margin for the roundings
    to bf16 and float32 on the way (three of at most 2^-8 each)."""
    return math.sqrt(weight.numel()) * weight.detach().abs().max().float().item() * ROUNDING_MARGIN


def attn_camera_norm(
    x: Tensor, attn: Tensor, gate: Tensor, cam_scale: Tensor, cam_shift: Tensor,
    norm_weight: Tensor, norm_bias: Tensor, eps: float, dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Self-attention residual, camera modulation, then norm3 (affine, float32) -> (x, norm3(x))."""
    x = x + attn * gate
    x = cam_scale * x + cam_shift
    normed = F.layer_norm(x.float(), (x.shape[-1],), norm_weight.float(), norm_bias.float(), eps)
    return x, normed.type_as(x).to(dtype)


def cross_residual_norm(
    x: Tensor, cross: Tensor, scale: Tensor, shift: Tensor, eps: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Cross-attention residual, then the FFN's modulated norm -> (x, FFN input)."""
    x = x + cross
    return x, modulated_norm(x, scale, shift, eps, dtype)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor) -> Tensor:
    return x + y * gate


def quantize_rows(x: Tensor) -> QuantizedRows:
    """x [..., K] -> (float8_e4m3fn [..., K], float32 scales [..., 1]) with x ~= q * scale."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR) / E4M3_MAX
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def attend(q: Tensor, k: Tensor, v: Tensor, attention: str) -> Tensor:
    """Unmasked SDPA with a backend preference: [1, S, H, D] x [1, n, H, D] -> [1, S, H*D]."""
    if attention == "fa4":  # not SDPA
        return attend_fa4(q, k.to(q.dtype), v.to(q.dtype))
    if attention in ("fa3", "fa3_fp8"):  # not SDPA; fa3_fp8's cross-attention in bf16
        return attend_fa3(q, k.to(q.dtype), v.to(q.dtype))
    backends = _BACKENDS[attention]
    args = (q.transpose(1, 2), k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2))
    if backends is None:
        out = F.scaled_dot_product_attention(*args)
    else:
        with sdpa_kernel(backends, set_priority=True):
            out = F.scaled_dot_product_attention(*args)  # [1, H, S, D]
    return out.transpose(1, 2).flatten(2)  # [1, S, H*D]


# FP8 GEMM inputs quantized by the kernel that makes them (`quantize_inputs`): the bf16
# activation is never written out for the GEMM to read back and quantize in a pass of its own.

def modulated_norm_q(x: Tensor, scale: Tensor, shift: Tensor, eps: float, dtype: torch.dtype) -> QuantizedRows:
    return quantize_rows(modulated_norm(x, scale, shift, eps, dtype))


def attn_camera_norm_q(*args) -> tuple[Tensor, QuantizedRows]:
    x, normed = attn_camera_norm(*args)
    return x, quantize_rows(normed)


def cross_residual_norm_q(*args) -> tuple[Tensor, QuantizedRows]:
    x, h = cross_residual_norm(*args)
    return x, quantize_rows(h)


def gelu_quantize(y: Tensor) -> QuantizedRows:
    """The FFN's hidden activation, quantized for the down projection."""
    return quantize_rows(F.gelu(y, approximate="tanh"))


@dataclass(frozen=True, slots=True)
class BlockKernels:
    """The region functions one fast model uses: eager, or compiled once for all blocks.

    With `quantize_inputs` (FP8 GEMMs only: `quant` "fused" or "triton") the regions that feed a
    GEMM return its input as `QuantizedRows` (modulated_norm, attn_camera_norm's and
    cross_residual_norm's second output) and the FFN's activation is `gelu_quantize`; "triton"
    runs those four as the one-pass kernels of `model/accel/triton_quant.py` with their tuned
    launches (`quantize_rows` stays the compiled function: as fast, exact codes). `triton_rope`:
    the self-attention's Q / K norm + RoPE (and their codes) as `model/accel/triton_rope.py`'s
    one-pass kernel."""

    modulated_norm: Callable[..., Tensor | QuantizedRows]
    rms_norm: Callable[..., Tensor]
    qk_norm_rope: Callable[..., Tensor]
    qk_norm_rope_codes: Callable[..., Tensor]
    attn_camera_norm: Callable[..., tuple[Tensor, Tensor | QuantizedRows]]
    cross_residual_norm: Callable[..., tuple[Tensor, Tensor | QuantizedRows]]
    gated_residual: Callable[..., Tensor]
    quantize_rows: Callable[..., QuantizedRows]
    gelu_quantize: Callable[..., QuantizedRows]
    attention: str
    compiled: bool
    quant: str = "gemm"
    fp8_attention: "CudnnFp8Attention | Fa3Fp8Attention | None" = None
    triton_rope: bool = False

    @property
    def quantize_inputs(self) -> bool:
        return self.quant != "gemm"

    @classmethod
    def build(cls, attention: str, compile: bool, quant: str = "gemm", triton_rope: bool = False) -> "BlockKernels":
        fused = quant != "gemm"
        fns = (modulated_norm_q if fused else modulated_norm, rms_norm, qk_norm_rope, qk_norm_rope_codes,
               attn_camera_norm_q if fused else attn_camera_norm,
               cross_residual_norm_q if fused else cross_residual_norm,
               gated_residual, quantize_rows, gelu_quantize)
        if compile:
            # static shapes: a chunk's token count is fixed per session size; a new size
            # compiles once more (dynamo's per-function cache)
            fns = tuple(torch.compile(f, dynamic=False, fullgraph=True) for f in fns)
        if quant == "triton":  # CUDA with Triton
            from model.accel import triton_quant as tq

            fns = (tq.tuned("modulated_norm_q"), *fns[1:4], tq.tuned("attn_camera_norm_q"),
                   tq.tuned("cross_residual_norm_q"), *fns[6:8], tq.tuned("gelu_quantize"))
        if triton_rope:  # CUDA with Triton
            from model.accel import triton_rope as tr

            fns = (*fns[:2], tr.qk_norm_rope, tr.qk_norm_rope_codes, *fns[4:])
        fp8_attention = None
        if attention == "cudnn_fp8":
            from model.accel.fp8_attention import CudnnFp8Attention

            fp8_attention = CudnnFp8Attention()
        elif attention == "fa3_fp8":
            from model.accel.fa3_attention import Fa3Fp8Attention

            fp8_attention = Fa3Fp8Attention()
        return cls(*fns, attention=attention, compiled=compile, quant=quant, fp8_attention=fp8_attention,
                   triton_rope=triton_rope)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(q, k, v, self.attention)

    def attend_self(self, q: Tensor | TensorCodes, k: Tensor | TensorCodes, v: Tensor | TensorCodes,
                    quantized: bool = False, dtype: torch.dtype | None = None) -> Tensor | QuantizedRows:
        """The self-attention over the session's cache ([1, n, H, D] K/V, or the code cache's
        (codes, descale) with an FP8 attention, Q too with the bound scales): FP8 with
        "cudnn_fp8" (with `quantized` its e4m3 output as it is, for an FP8 GEMM, else in
        `dtype`, by default q's) or "fa3_fp8" (its bf16 output in `dtype`: an FP8 GEMM quantizes
        it as any input), else `attend`."""
        if self.fp8_attention is not None:
            if quantized and self.fp8_attention.returns_codes:
                return self.fp8_attention.codes(q, k, v)
            return self.fp8_attention(q, k, v, dtype)
        if isinstance(k, tuple) or isinstance(q, tuple):
            raise ValueError(f"a code cache (model/dit/kv_codes.py) is read by attention='cudnn_fp8' or "
                             f"'fa3_fp8', not {self.attention!r}")
        return attend(q, k, v, self.attention)


def batched(kv: Tensor | TensorCodes) -> Tensor | TensorCodes:
    """A cache's [n, H, D] K or V (or its (codes, descale)) with the batch dimension: [1, n, H, D]."""
    return (kv[0][None], kv[1]) if isinstance(kv, tuple) else kv[None]
