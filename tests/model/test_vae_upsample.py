"""model/vae/upsample.py: nearest 2x + conv3x3 as one low-resolution conv + pixel shuffle."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from model.vae.upsample import UpsampleConv2x, phase_weights
from model.vae.blocks import NearestUpsample2x


@pytest.mark.parametrize("kernel", [3, 2])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(3, 8, 5, 7), (1, 8, 1, 1), (2, 8, 6, 4)])
def test_one_low_resolution_conv_computes_upsample_then_conv(shape, channels_last, kernel):
    gen = torch.Generator().manual_seed(sum(shape))
    conv = nn.Conv2d(shape[1], 6, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        conv.bias.copy_(torch.randn(6, generator=gen))
    x = torch.randn(shape, generator=gen)
    if channels_last:
        conv.weight.data = conv.weight.data.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    want = conv(NearestUpsample2x()(x))
    got = UpsampleConv2x(conv, kernel)(x)
    assert got.shape == want.shape == (shape[0], 6, 2 * shape[2], 2 * shape[3])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last or shape[2:] == (1, 1)


def test_each_phase_sums_the_taps_that_land_on_one_source_pixel():
    w = torch.arange(9.0).view(1, 1, 3, 3)  # W[y, x] = 3y + x
    p = phase_weights(w)
    rows = {0: [[1, 0, 0], [0, 1, 1], [0, 0, 0]], 1: [[0, 0, 0], [1, 1, 0], [0, 0, 1]]}
    for k, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        ra, rb = torch.tensor(rows[a], dtype=torch.float32), torch.tensor(rows[b], dtype=torch.float32)
        assert torch.equal(p[k, 0], ra @ w[0, 0] @ rb.T)
    assert p[0, 0, 2].abs().sum() == 0 and p[0, 0, :, 2].abs().sum() == 0  # phase (0, 0) never reads row/col i+1


def test_the_2x2_phase_kernels_are_the_3x3_ones_without_their_zero_row_and_column():
    w = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(5))
    full, small = phase_weights(w, 3), phase_weights(w, 2)
    assert small.shape == (16, 3, 2, 2)
    for k, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        block = full[4 * k:4 * k + 4]
        rows, cols = slice(a, a + 2), slice(b, b + 2)  # phase a reads rows {i - 1, i} (a = 0) or {i, i + 1}
        assert torch.equal(block[:, :, rows, cols], small[4 * k:4 * k + 4])
        outside = block.clone()
        outside[:, :, rows, cols] = 0
        assert not outside.any()  # the 3x3 phase kernel is zero outside that 2x2 block
