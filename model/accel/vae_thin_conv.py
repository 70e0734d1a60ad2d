"""The VAE's thin convolutions with their channels zero-padded: the encoder's first conv (3 input
channels, the RGB frames) and the decoder's last (3 output channels).

cuDNN runs a 3x3x3 conv with 3 input or 3 output channels at ~25 TFLOP/s (2.9 ms each per
12-frame chunk at 464x832 on the H200, `h200_round2_vae_upsample_2x2_profile_shapes.txt`):
no tensor-core kernel takes 3 channels, whatever the layout. Padded to a multiple of 8 the
same convolution is a regular implicit GEMM: the zero channels add zero products (the sums
can only round differently), the input pad costs one small copy (the 3-channel input is 1/32
of the 96-channel side), and the padded outputs are dropped as a view. The causal history the
cache keeps is the conv's unpadded input. Opt-in: `AccelOptions.vae_pad_channels`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from model.accel.vae_fast import PaddedCausalConv3d
from model.vae import WanVAE


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class ChannelPaddedConv3d(PaddedCausalConv3d):
    """A PaddedCausalConv3d that convolves with zero-padded input / output channels."""

    padded_weight: Tensor
    padded_bias: Tensor | None

    def pad_channels(self, multiple: int) -> None:
        out_c, in_c = self.weight.shape[:2]
        out_p, in_p = _round_up(out_c, multiple), _round_up(in_c, multiple)
        w = self.weight.new_zeros((out_p, in_p, *self.weight.shape[2:]))
        w[:out_c, :in_c] = self.weight.detach()
        if not self.weight.is_contiguous():  # channels-last weights stay channels-last
            w = w.contiguous(memory_format=torch.channels_last_3d)
        self.register_buffer("padded_weight", w, persistent=False)
        bias = None
        if self.bias is not None:
            bias = self.bias.new_zeros(out_p)
            bias[:out_c] = self.bias.detach()
        self.register_buffer("padded_bias", bias, persistent=False)

    def conv(self, x: Tensor) -> Tensor:
        in_c, in_p = x.shape[1], self.padded_weight.shape[1]
        if in_p != in_c:
            b, _, t, h, w = x.shape
            last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)
            xp = torch.empty((b, in_p, t, h, w), dtype=x.dtype, device=x.device,
                             memory_format=torch.channels_last_3d if last else torch.contiguous_format)
            xp[:, in_c:].zero_()
            xp[:, :in_c] = x
            x = xp
        pw, _, ph, _ = self.spatial_pad
        bias = None if self.fold_bias else self.padded_bias
        y = F.conv3d(x, self.padded_weight, bias, self.stride, (0, ph, pw), self.dilation, self.groups)
        return y[:, :self.out_channels]


def pad_thin_convs(vae: WanVAE, multiple: int) -> int:
    """Every PaddedCausalConv3d of `vae` with fewer than `multiple` input or output channels
    becomes a ChannelPaddedConv3d padded to a multiple of `multiple` (in place, after
    `pad_in_conv` and the weights' layout); returns how many."""
    n = 0
    for module in vae.modules():
        if type(module) is PaddedCausalConv3d and min(module.in_channels, module.out_channels) < multiple:
            module.__class__ = ChannelPaddedConv3d
            module.pad_channels(multiple)
            n += 1
    return n

