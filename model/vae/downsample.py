"""The encoder's spatial downsampling (pad right / bottom by 1, 3x3 conv of stride 2) as one conv
with its padding inside (`AccelOptions.vae_downsample_in_conv`).

`Downsample.resample` writes a padded copy of its input ([12, 96, 465, 833] for a later chunk at
464x832: a fill and a 1 GB copy, 1.4 ms on the H200) because the padding is one-sided, which a
convolution's own (symmetric) padding cannot express. A 4x4 kernel can: with padding 1 and stride
2, output (i, j) reads input rows 2i - 1 .. 2i + 2; the kernel W' with W'[a + 1, b + 1] = W[a, b]
and a zero first row and column weighs rows 2i .. 2i + 2 as the 3x3 conv over the padded input
does, and the zero row the symmetric padding adds at the bottom is the one-sided pad's. Same
output size (h / 2), the same function (7 of the 16 taps are zeros, which add nothing); no padded
copy, 16 / 9 of the multiplies on a convolution that is bound by its bytes.
"""
from __future__ import annotations

import torch
from torch import nn

from model.vae.model import WanVAE
from model.vae.blocks import Downsample


def padded_conv(conv: nn.Conv2d) -> nn.Conv2d:
    """ZeroPad2d((0, 1, 0, 1)) + `conv` (3x3, stride 2, no padding) -> one 4x4 conv, stride 2,
    padding 1, the same weights shifted by one row and column."""
    assert conv.kernel_size == (3, 3) and conv.stride == (2, 2) and conv.padding == (0, 0), conv
    out = nn.Conv2d(conv.in_channels, conv.out_channels, 4, stride=2, padding=1, bias=conv.bias is not None,
                    device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        out.weight.zero_()
        out.weight[:, :, 1:, 1:] = conv.weight
        if conv.bias is not None:
            out.bias.copy_(conv.bias)
    return out.requires_grad_(False)


def downsample_in_conv(vae: WanVAE) -> int:
    """Every encoder Downsample's (pad, conv) becomes one padded 4x4 conv (in place); returns how many."""
    n = 0
    for module in vae.modules():
        if isinstance(module, Downsample):
            pad, conv = module.resample
            assert isinstance(pad, nn.ZeroPad2d) and tuple(pad.padding) == (0, 1, 0, 1), pad
            module.resample = padded_conv(conv)
            n += 1
    return n
