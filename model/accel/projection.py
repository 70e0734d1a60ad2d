"""The fast block's GEMMs: y = x W^T + b, in the weights' dtype or in FP8 e4m3.

A `Projection` can stand for several Linears fused along the output features (q/k/v; camera
scale/shift): the Linears' parameters become views of the fused weight, so the state dict and
the memory stay as they were. `Fp8Projection` quantizes W per output row (column scales of
W^T) once and x per token at every call (or takes x already quantized by the kernel that made
it: `QuantizedRows`), and multiplies with `torch._scaled_mm`, the bias in its epilogue.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.accel.kernels import quantize_rows
from model.dit.e4m3 import QuantizedRows


class Projection:
    """y = x W^T + b with W [N, K] (not a module: the owning Linears keep the parameters)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight, self.bias = weight, bias

    @classmethod
    def of(cls, linear: nn.Linear) -> "Projection":
        return cls(linear.weight, linear.bias)

    @classmethod
    def fuse(cls, linears: list[nn.Linear]) -> "Projection":
        """One GEMM for Linears sharing their input; their parameters become views of it."""
        assert len({lin.in_features for lin in linears}) == 1, "fused Linears must share the input"
        assert all(lin.bias is not None for lin in linears)
        weight = torch.cat([lin.weight for lin in linears])  # [sum N, K]
        bias = torch.cat([lin.bias for lin in linears])  # [sum N]
        lo = 0
        for lin in linears:
            hi = lo + lin.out_features
            lin.weight = nn.Parameter(weight[lo:hi], requires_grad=False)
            lin.bias = nn.Parameter(bias[lo:hi], requires_grad=False)
            lo = hi
        return cls(weight, bias)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def gelu(self, x: Tensor) -> Tensor:
        """gelu_tanh(x W^T + b), the FFN's first half (cuBLASLt's GELU epilogue was measured: no
        gain on the H200, docs/PERFORMANCE.md round 2)."""
        return F.gelu(self(x), approximate="tanh")


class Fp8Projection:
    """y ~= x W^T + b with W and x in float8_e4m3fn: W per output row, x per token.

    bias_epilogue: the bias added on the float32 accumulator inside the GEMM (one pass over the
      output less than a separate add; one bf16 rounding less). fast_accum: Hopper's FP8 fast
      accumulation (`use_fast_accum`: no periodic promotion of the partial sums to float32).
    """

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype,
                 quantize: Callable[[Tensor], QuantizedRows] = quantize_rows) -> None:
        assert weight.dtype == torch.float8_e4m3fn and scale.shape == (1, weight.shape[0])
        self.weight, self.scale, self.bias = weight, scale, bias
        self.out_dtype, self.quantize = out_dtype, quantize
        self.bias_epilogue, self.fast_accum = True, False

    @classmethod
    def of(cls, proj: Projection, quantize: Callable[[Tensor], QuantizedRows] = quantize_rows
           ) -> "Fp8Projection":
        q, scale = quantize_rows(proj.weight)  # [N, K], [N, 1]
        return cls(q, scale.t().contiguous(), proj.bias, proj.weight.dtype, quantize)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scale.nbytes

    def __call__(self, x: Tensor | QuantizedRows) -> Tensor:
        xq, xs = self.quantize(x) if isinstance(x, Tensor) else x  # [..., K] e4m3, [..., 1]
        lead = xq.shape[:-1]
        bias = self.bias if self.bias_epilogue else None
        y = torch._scaled_mm(xq.reshape(-1, xq.shape[-1]), self.weight.t(), scale_a=xs.reshape(-1, 1),
                             scale_b=self.scale, bias=bias, out_dtype=self.out_dtype,
                             use_fast_accum=self.fast_accum)
        if self.bias is not None and bias is None:
            y = y + self.bias
        return y.view(*lead, self.out_features)

    def gelu(self, x: Tensor | QuantizedRows) -> Tensor:
        return F.gelu(self(x), approximate="tanh")
