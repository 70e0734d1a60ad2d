"""model/accel/vae_thin_conv.py: the VAE's 3-channel convs with zero-padded channels."""
from __future__ import annotations

import copy

import pytest
import torch

from model.accel import AccelOptions, optimize_vae
from model.accel.vae_fast import PaddedCausalConv3d
from model.accel.vae_thin_conv import ChannelPaddedConv3d
from model.config import VAEConfig
from model.vae import init_vae_random


def test_the_encoders_first_and_the_decoders_last_conv_are_padded():
    vae = optimize_vae(init_vae_random(VAEConfig(dim=16), torch.float32, "cpu", 0),
                       AccelOptions(vae_pad_in_conv=True, vae_pad_channels=8))
    padded = {name: m for name, m in vae.named_modules() if isinstance(m, ChannelPaddedConv3d)}
    assert len(padded) == 2, sorted(padded)
    shapes = sorted((m.in_channels, m.out_channels, tuple(m.padded_weight.shape[:2])) for m in padded.values())
    assert shapes == [(3, 16, (16, 8)), (16, 3, (8, 16))]
    # the padded parameters are not part of the state (the checkpoint's keys stay)
    assert all("padded" not in key for key in vae.state_dict())


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("cin, cout", [(3, 16), (16, 3)])
def test_a_padded_conv_computes_the_thin_one(cin, cout, channels_last):
    gen = torch.Generator().manual_seed(cin)
    conv = PaddedCausalConv3d(cin, cout, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        conv.bias.copy_(torch.randn(cout, generator=gen))
    x = torch.randn(1, cin, 4, 6, 5, generator=gen)
    past = torch.randn(1, cin, 2, 6, 5, generator=gen)
    if channels_last:
        conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last_3d)
        x, past = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x, past))
    padded = copy.deepcopy(conv)
    padded.__class__ = ChannelPaddedConv3d
    padded.pad_channels(8)
    want, got = conv(x, past), padded(x, past)
    assert got.shape == want.shape == (1, cout, 4, 6, 5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
