"""The VAE encoder's first conv (3 -> 96 channels, 3x3x3, one pixel of zero padding, the causal
past) as a Triton kernel (CUDA with Triton; `AccelOptions.vae_triton_stem`).

cuDNN runs it at about 25 TFLOP/s: with 3 input channels its implicit GEMM has a reduction of 81
in tiles built for wide channels (a later chunk at 464x832: the past concatenated, the conv
2.9 ms, its bias in a pass of its own 1.3 ms; 4.0 ms in all, docs/PERFORMANCE.md, session 8).
The output's bytes (0.89 GB) allow about 0.25 ms.

The input (the cached past frames, zero frames where the stream has fewer, the new frames) is
written once into a channels-last buffer with its zero border, [T_in, H + 2, W + 2, C]: 3
channels, 32 MB for 14 frames, 0.08 ms. For a fixed (dt, dh) tap an output pixel's receptive
field is then KW x C = 9 contiguous elements of it, and the 81 elements of all taps one gathered
[BLOCK_M, 128] tile for one dot with the weights, which each program loads once (a few programs
per SM walk the pixel blocks). The bias is added in float32 and the channels-last output written
once: the products summed in float32 (in another order than cuDNN's), rounded once to the
output's dtype, the conv's function. 0.61 ms per later chunk (session 8; a first kernel that
loaded each (dt, dh) tap's weights per block of pixels took 1.48 ms).

(The decoder's last conv, 96 -> 3, was tried the same way and measured 11-12 ms against cuDNN's
3.5: its 27 taps each reread 96 channels per pixel; session 8.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from model.vae.model import WanVAE
from model.vae.blocks import CausalConv3d

# session 8 on an H200 (benchmarks.vae_conv_probe): 0.61 ms per later chunk; 0.63-0.83 ms for the
# other launches tried, 1.48 ms for a kernel that loaded its 9 (dt, dh) taps' weights per block
BLOCK_M, WARPS, PER_SM = 64, 8, 2


# Sizes not specialized: one compiled kernel for every session size (Triton would compile again
# for each size's divisibility by 16).
@triton.jit(do_not_specialize=["M", "H", "W", "stride_t", "stride_h"])
def _stem_conv(x_ptr, w_ptr, b_ptr, y_ptr, M, H, W, stride_t, stride_h,
               C: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, RUN: tl.constexpr,
               K_PAD: tl.constexpr, C_OUT: tl.constexpr, N_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """The conv of the padded channels-last input: per BLOCK_M output pixels the 81 taps gathered
    as one [BLOCK_M, K_PAD] tile (k = (dt, dh, the run's element)) for one dot with the weights,
    which each program loads once with the bias before walking its pixel blocks."""
    k = tl.arange(0, K_PAD)
    tap = k // RUN
    k_offset = (tap // KH) * stride_t + (tap % KH) * stride_h + k % RUN  # within the padded input
    k_mask = (k < KT * KH * RUN)[None, :]
    n = tl.arange(0, N_PAD)
    n_mask = (n < C_OUT)[None, :]
    wt = tl.load(w_ptr + k[:, None] * N_PAD + n[None, :])
    bias = tl.load(b_ptr + n, mask=n < C_OUT, other=0.0)[None, :]
    for block in range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        m = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # pixels < 2^31
        valid = (m < M)[:, None]
        w = m % W
        h = (m // W) % H
        t = m // (W * H)
        corner = t * stride_t + h * stride_h + w * C
        a = tl.load(x_ptr + corner[:, None] + k_offset[None, :], mask=valid & k_mask, other=0.0)
        acc = tl.dot(a, wt) + bias
        tl.store(y_ptr + m[:, None] * C_OUT + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=valid & n_mask)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot's smallest side is 16


def pack_stem_weight(weight: Tensor) -> Tensor:
    """[C_out, C, KT, KH, KW] -> [K_PAD, N_PAD]: row k = (dt, dh, (dw, c)) as _stem_conv
    gathers it, zero rows from KT * KH * KW * C and zero columns from C_out."""
    c_out = weight.shape[0]
    rows = weight.permute(2, 3, 4, 1, 0).reshape(-1, c_out)
    packed = weight.new_zeros(_pow2(rows.shape[0]), _pow2(c_out))
    packed[:rows.shape[0], :c_out] = rows
    return packed


def padded_input(x: Tensor, past: Tensor | None, front: int, pad: tuple[int, int]) -> Tensor:
    """[1, C, T, H, W] (and past [1, C, n, H, W]) -> the conv's input [front + T, H + 2ph, W + 2pw, C],
    channels-last: `front` frames of zeros then the past's frames (the last `front` of them),
    the new frames, and the zero border."""
    _, c, t, h, w = x.shape
    ph, pw = pad
    buf = x.new_zeros(front + t, h + 2 * ph, w + 2 * pw, c)
    inner = buf[:, ph:ph + h, pw:pw + w]
    n_past = 0 if past is None else min(front, past.shape[2])
    if n_past:
        inner[front - n_past:front].copy_(past[0, :, past.shape[2] - n_past:].permute(1, 2, 3, 0))
    inner[front:].copy_(x[0].permute(1, 2, 3, 0))
    return buf


def stem_conv(buf: Tensor, packed: Tensor, bias: Tensor, kernel: tuple[int, int, int], c_out: int,
              block_m: int = BLOCK_M, warps: int = WARPS, per_sm: int = PER_SM) -> Tensor:
    """The conv of a padded channels-last input `buf` [T_in, Hp, Wp, C] (stride 1; weights by
    pack_stem_weight): output [1, C_out, T_in - KT + 1, Hp - KH + 1, Wp - KW + 1] in buf's
    dtype, channels-last 3d; `per_sm` programs per SM."""
    kt, kh, kw = kernel
    t_in, hp, wp, c = buf.shape
    assert buf.is_contiguous() and bias.dtype == torch.float32 and packed.dtype == buf.dtype
    t, h, w = t_in - kt + 1, hp - kh + 1, wp - kw + 1
    y = torch.empty((1, t, h, w, c_out), dtype=buf.dtype, device=buf.device)  # channels-last
    m = t * h * w
    # Triton's interpreter (the tests) runs on the CPU: 2 "SMs" there
    sms = torch.cuda.get_device_properties(buf.device).multi_processor_count if buf.is_cuda else 2
    grid = (min(triton.cdiv(m, block_m), sms * per_sm),)
    _stem_conv[grid](buf, packed, bias, y, m, h, w, hp * wp * c, wp * c, C=c, KT=kt, KH=kh, RUN=kw * c,
                     K_PAD=packed.shape[0], C_OUT=c_out, N_PAD=packed.shape[1], BLOCK_M=block_m,
                     num_warps=warps)
    return y.permute(0, 4, 1, 2, 3)


def _check_stem(conv: nn.Module) -> None:
    assert isinstance(conv, CausalConv3d) and conv.bias is not None, conv
    assert conv.stride == (1, 1, 1) and conv.dilation == (1, 1, 1) and conv.groups == 1, conv
    assert conv.front == conv.kernel_size[0] - 1, conv
    assert conv.spatial_pad == (conv.kernel_size[2] // 2,) * 2 + (conv.kernel_size[1] // 2,) * 2, conv


class TritonStemConv3d(CausalConv3d):
    """A CausalConv3d with few input channels (the encoder's `conv1`) run by `stem_conv`: its
    past, zero frames and border written once into the padded buffer, the bias inside the kernel."""

    packed: Tensor
    bias_f32: Tensor

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        pw, _, ph, _ = self.spatial_pad
        buf = padded_input(x, past, self.front, (ph, pw))
        return stem_conv(buf, self.packed, self.bias_f32, self.kernel_size, self.out_channels)


def triton_stem(vae: WanVAE) -> int:
    """The encoder's first conv becomes a TritonStemConv3d (in place); returns how many (1)."""
    conv = vae.encoder.conv1
    _check_stem(conv)
    conv.__class__ = TritonStemConv3d
    conv.register_buffer("packed", pack_stem_weight(conv.weight.detach().contiguous()), persistent=False)
    conv.register_buffer("bias_f32", conv.bias.detach().float(), persistent=False)
    return 1
