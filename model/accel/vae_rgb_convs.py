"""The VAE's two RGB convs as Triton kernels (CUDA with Triton): the encoder's first conv
(3 -> 96 channels, `AccelOptions.vae_triton_stem`) and the decoder's last (96 -> 3,
`AccelOptions.vae_triton_head`), both 3x3x3 with one pixel of zero padding and the causal past.

cuDNN runs them at about 25 TFLOP/s: with 3 channels on one side its implicit GEMMs have a
reduction of 81 or an output width of 3 and pay for tiles built for wide channels (a later
chunk at 464x832: the stem 2.9 ms plus its bias in a pass of its own, 1.3 ms; the head 3.0 ms
after a `cat` of its 96-channel past and input; docs/PERFORMANCE.md, session 8).

Stem: the input (the cached past frames, zero frames where the stream has fewer, the new frames)
is written once into a channels-last buffer with its zero border, [T_in, H + 2, W + 2, C]: 3
channels, 32 MB for 14 frames. For a fixed (dt, dh) tap the receptive field of an output pixel is
then KW x C = 9 contiguous elements, so a program of BLOCK_M output pixels does KT x KH = 9 dots
of [BLOCK_M, 16] (the 9 elements, zero-padded) x [16, C_out], adds the bias and writes the
channels-last output (0.89 GB: ~0.25 ms of bytes) once.

Head: no buffer (the input is 96 channels, 1 GB): the kernel reads the past and the new frames
where they are (channels-last, the border masked) and does one dot per tap (27) of
[BLOCK_M, C_PAD] x [C_PAD, 16]; the three dw taps of a row reread the same pixels from L1.

Both: the products summed in float32 (in another order than cuDNN's) plus the bias in float32,
rounded once to the output's dtype: the conv's function.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from model.vae import WanVAE
from model.vae_blocks import CausalConv3d

BLOCK_M = 128
WARPS = 4
HEAD_BLOCK_M = 128
HEAD_WARPS = 4


# Sizes not specialized: one compiled kernel for every session size (Triton would compile again for
# each size's divisibility by 16; the head's compile takes ~10 s). The head's strides are
# multiples of its 96 channels at every size, so specializing them costs no recompiles.
@triton.jit(do_not_specialize=["M", "H", "W", "stride_t", "stride_h"])
def _stem_conv(x_ptr, w_ptr, b_ptr, y_ptr, M, H, W, stride_t, stride_h,
               C: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, RUN: tl.constexpr, RUN_PAD: tl.constexpr,
               C_OUT: tl.constexpr, N_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixel (t, h, w)
    valid = m < M
    w = m % W
    h = (m // W) % H
    t = m // (W * H)
    corner = t * stride_t + h * stride_h + w * C  # the receptive field's first element (padded input)
    r = tl.arange(0, RUN_PAD)
    n = tl.arange(0, N_PAD)
    a_mask = valid[:, None] & (r < RUN)[None, :]
    acc = tl.zeros((BLOCK_M, N_PAD), dtype=tl.float32)
    for dt in tl.static_range(KT):
        for dh in tl.static_range(KH):
            a = tl.load(x_ptr + corner[:, None] + (dt * stride_t + dh * stride_h) + r[None, :], mask=a_mask, other=0.0)
            wt = tl.load(w_ptr + ((dt * KH + dh) * RUN_PAD + r)[:, None] * N_PAD + n[None, :])
            acc = tl.dot(a, wt, acc)
    acc += tl.load(b_ptr + n, mask=n < C_OUT, other=0.0)[None, :]
    tl.store(y_ptr + m[:, None] * C_OUT + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=valid[:, None] & (n < C_OUT)[None, :])


@triton.jit(do_not_specialize=["M", "H", "W", "FRONT", "N_PAST"])
def _head_conv(x_ptr, p_ptr, w_ptr, b_ptr, y_ptr, M, H, W, FRONT, N_PAST, sx_t, sx_h, sx_w, sp_t, sp_h, sp_w,
               C: tl.constexpr, C_PAD: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
               HAS_PAST: tl.constexpr, C_OUT: tl.constexpr, N_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixel (t, h, w)
    valid = m < M
    w = m % W
    h = (m // W) % H
    t = m // (W * H)
    c = tl.arange(0, C_PAD)
    cmask = (c < C)[None, :]
    n = tl.arange(0, N_PAD)
    acc = tl.zeros((BLOCK_M, N_PAD), dtype=tl.float32)
    for tap in range(KT * KH * KW):  # a loop, not unrolled: 27 unrolled dots take minutes to compile
        dt = tap // (KH * KW)
        dh = (tap // KW) % KH
        dw = tap % KW
        ti = t + dt - FRONT  # the input frame: >= 0 a new one, < 0 the past's (N_PAST + ti) or a zero frame
        hi = h + dh - KH // 2
        wi = w + dw - KW // 2
        ok = valid & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
        src = x_ptr + (ti * sx_t + hi * sx_h + wi * sx_w)
        if HAS_PAST:  # the past's frame where ti < 0 (zeros before it)
            pi = ti + N_PAST
            src = tl.where(ti >= 0, src, p_ptr + (pi * sp_t + hi * sp_h + wi * sp_w))
            ok = ok & (pi >= 0)
        else:
            ok = ok & (ti >= 0)
        a = tl.load(src[:, None] + c[None, :], mask=ok[:, None] & cmask, other=0.0)
        wt = tl.load(w_ptr + (tap * C_PAD + c)[:, None] * N_PAD + n[None, :])
        acc = tl.dot(a, wt, acc)
    acc += tl.load(b_ptr + n, mask=n < C_OUT, other=0.0)[None, :]
    tl.store(y_ptr + m[:, None] * C_OUT + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=valid[:, None] & (n < C_OUT)[None, :])


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot's smallest side is 16


def pack_stem_weight(weight: Tensor) -> Tensor:
    """[C_out, C, KT, KH, KW] -> [KT * KH * RUN_PAD, N_PAD]: per (dt, dh) tap the rows (dw, c)
    in the padded input's order, zero rows up to RUN_PAD and zero columns up to N_PAD."""
    c_out, c, kt, kh, kw = weight.shape
    run = kw * c
    rows = weight.permute(2, 3, 4, 1, 0).reshape(kt * kh, run, c_out)  # [(dt, dh), (dw, c), C_out]
    packed = weight.new_zeros(kt * kh, _pow2(run), _pow2(c_out))
    packed[:, :run, :c_out] = rows
    return packed.reshape(-1, packed.shape[-1])


def pack_head_weight(weight: Tensor) -> Tensor:
    """[C_out, C, KT, KH, KW] -> [KT * KH * KW * C_PAD, N_PAD]: per tap its [C, C_out] matrix,
    zero rows up to C_PAD and zero columns up to N_PAD."""
    c_out, c, kt, kh, kw = weight.shape
    taps = weight.permute(2, 3, 4, 1, 0).reshape(kt * kh * kw, c, c_out)
    packed = weight.new_zeros(kt * kh * kw, _pow2(c), _pow2(c_out))
    packed[:, :c, :c_out] = taps
    return packed.reshape(-1, packed.shape[-1])


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


def _channels_last_out(t: int, h: int, w: int, c_out: int, like: Tensor) -> Tensor:
    return torch.empty((1, t, h, w, c_out), dtype=like.dtype, device=like.device)


def stem_conv(buf: Tensor, packed: Tensor, bias: Tensor, kernel: tuple[int, int, int], c_out: int,
              block_m: int = BLOCK_M, warps: int = WARPS) -> Tensor:
    """The conv of a padded channels-last input `buf` [T_in, Hp, Wp, C] (stride 1): output
    [1, C_out, T_in - KT + 1, Hp - KH + 1, Wp - KW + 1] in buf's dtype, channels-last 3d."""
    kt, kh, kw = kernel
    t_in, hp, wp, c = buf.shape
    assert buf.is_contiguous() and bias.dtype == torch.float32 and packed.dtype == buf.dtype
    t, h, w = t_in - kt + 1, hp - kh + 1, wp - kw + 1
    y = _channels_last_out(t, h, w, c_out, buf)
    m = t * h * w
    _stem_conv[(triton.cdiv(m, block_m),)](buf, packed, bias, y, m, h, w, hp * wp * c, wp * c,
                                           C=c, KT=kt, KH=kh, RUN=kw * c, RUN_PAD=packed.shape[0] // (kt * kh),
                                           C_OUT=c_out, N_PAD=packed.shape[1], BLOCK_M=block_m, num_warps=warps)
    return y.permute(0, 4, 1, 2, 3)


def head_conv(x: Tensor, past: Tensor | None, front: int, packed: Tensor, bias: Tensor, kernel: tuple[int, int, int],
              c_out: int, block_m: int = HEAD_BLOCK_M, warps: int = HEAD_WARPS) -> Tensor:
    """The causal conv (stride 1, zero padding kernel // 2 in h and w) of x [1, C, T, H, W] after
    `front` frames of past (the last of `past` [1, C, n, H, W], zeros before them), both with
    their channels contiguous (channels-last 3d): output [1, C_out, T, H, W] in x's dtype,
    channels-last 3d."""
    kt, kh, kw = kernel
    _, c, t, h, w = x.shape
    assert x.stride(1) == 1 and (past is None or past.stride(1) == 1), "channels-last 3d inputs"
    assert front == kt - 1 and bias.dtype == torch.float32 and packed.dtype == x.dtype
    y = _channels_last_out(t, h, w, c_out, x)
    m = t * h * w
    p = x if past is None else past
    _head_conv[(triton.cdiv(m, block_m),)](
        x, p, packed, bias, y, m, h, w, front, 0 if past is None else past.shape[2],
        x.stride(2), x.stride(3), x.stride(4), p.stride(2), p.stride(3), p.stride(4),
        C=c, C_PAD=packed.shape[0] // (kt * kh * kw), KT=kt, KH=kh, KW=kw, HAS_PAST=past is not None,
        C_OUT=c_out, N_PAD=packed.shape[1], BLOCK_M=block_m, num_warps=warps)
    return y.permute(0, 4, 1, 2, 3)


def _check_conv(conv: nn.Module) -> None:
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


class TritonHeadConv3d(CausalConv3d):
    """A CausalConv3d with few output channels (the decoder's last) run by `head_conv`: the
    past and the new frames read where they are (no `cat`), the bias inside the kernel."""

    packed: Tensor
    bias_f32: Tensor

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        x = x.contiguous(memory_format=torch.channels_last_3d)  # a no-op on the served layout
        if past is not None:
            past = past.contiguous(memory_format=torch.channels_last_3d)
        return head_conv(x, past, self.front, self.packed, self.bias_f32, self.kernel_size, self.out_channels)


def _to_triton(conv: CausalConv3d, cls: type, packed: Tensor) -> None:
    _check_conv(conv)
    conv.__class__ = cls
    conv.register_buffer("packed", packed, persistent=False)
    conv.register_buffer("bias_f32", conv.bias.detach().float(), persistent=False)


def triton_stem(vae: WanVAE) -> int:
    """The encoder's first conv becomes a TritonStemConv3d (in place); returns how many (1)."""
    conv = vae.encoder.conv1
    _to_triton(conv, TritonStemConv3d, pack_stem_weight(conv.weight.detach().contiguous()))
    return 1


def triton_head(vae: WanVAE) -> int:
    """The decoder's last conv becomes a TritonHeadConv3d (in place); returns how many (1)."""
    conv = vae.decoder.head[2]
    _to_triton(conv, TritonHeadConv3d, pack_head_weight(conv.weight.detach().contiguous()))
    return 1
