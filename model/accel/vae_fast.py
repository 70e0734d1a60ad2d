"""VAE transforms: RMSNorm + SiLU in one kernel, nearest upsampling in the compute dtype.

The VAE's residual blocks and heads run `SiLU(RMSNorm(x))` on every activation of up to
[1, 96, 4, 464, 832]: five eager passes (norm, divide, two scalings, SiLU). `NormSiLU` takes the
RMSNorm's place with one compiled function (the SiLU after it becomes an Identity).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.vae import WanVAE
from model.vae_blocks import Decoder3d, Encoder3d, NearestUpsample2x, ResidualBlock, RMSNorm


def rms_norm_silu(x: Tensor, gain: Tensor) -> Tensor:
    """SiLU(normalize(x over channels) * gain) with gain = sqrt(C) * gamma."""
    return F.silu(F.normalize(x, dim=1) * gain)


class NormSiLU(RMSNorm):
    """An RMSNorm that also applies the SiLU following it (same parameters). The gain
    sqrt(C) * gamma is one tensor (no float argument: one compiled kernel for every width)."""

    fn: Callable[[Tensor, Tensor], Tensor]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x, self.gamma * self.scale)


class NearestUpsample2xNative(NearestUpsample2x):
    """Nearest 2x upsampling in the input dtype (a copy: bit-identical to the float32 path)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, scale_factor=(2.0, 2.0), mode="nearest-exact")


def fuse_norm_silu(vae: WanVAE, fn: Callable[[Tensor, Tensor], Tensor] = rms_norm_silu) -> int:
    """Give every RMSNorm -> SiLU pair of `vae` one function `fn` (in place); returns the pairs."""
    pairs = 0
    for module in vae.modules():
        if isinstance(module, ResidualBlock):
            seqs = [(module.residual, 0), (module.residual, 3)]
        elif isinstance(module, (Encoder3d, Decoder3d)):
            seqs = [(module.head, 0)]
        else:
            continue
        for seq, i in seqs:
            assert isinstance(seq[i], RMSNorm) and isinstance(seq[i + 1], (nn.SiLU, nn.Identity))
            seq[i].__class__ = NormSiLU
            seq[i].fn = fn
            seq[i + 1] = nn.Identity()
            pairs += 1
    return pairs


def native_upsampling(vae: WanVAE) -> None:
    """Nearest upsampling without the float32 round trip (CUDA has bf16 kernels)."""
    for module in vae.modules():
        if type(module) is NearestUpsample2x:
            module.__class__ = NearestUpsample2xNative


# Distinct (shape, layout) inputs of the RMSNorm + SiLU pairs of one session size: each
# compiles once. Static shapes on purpose: dynamic=True gave wrong results here (torch 2.13
# CPU inductor, inputs with size-1 time dims), static ones are exact.
VAE_NORM_SHAPES = 64


def compiled_norm_silu() -> Callable[[Tensor, Tensor], Tensor]:
    """`rms_norm_silu` compiled per input shape; raises dynamo's process-wide recompile limit
    to VAE_NORM_SHAPES so that every pair stays compiled (beyond it: eager, still correct)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, VAE_NORM_SHAPES)
    return torch.compile(rms_norm_silu, dynamic=False)
