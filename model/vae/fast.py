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

from model.vae.model import WanVAE
from model.vae.blocks import CausalConv3d, Decoder3d, Encoder3d, NearestUpsample2x, ResidualBlock, RMSNorm
from model.vae.cache import CACHE_T


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


# ---- round 2: each causal-conv input written once, conv bias folded into the next kernel ----

def _like_layout(t: Tensor, like: Tensor) -> Tensor:
    """`t` in `like`'s memory format (channels-last 3d or contiguous)."""
    if like.dim() == 5 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last_3d):
        return t.contiguous(memory_format=torch.channels_last_3d)
    return t


class PaddedCausalConv3d(CausalConv3d):
    """A CausalConv3d whose input is written once: the spatial zero padding is the convolution's
    own (cuDNN reads the border as zeros, no padded copy), the temporal past (cached frames,
    zero frames where the stream has fewer) and the new frames are one `cat`. Same function as
    the plain conv (zeros are zeros); `fold_bias` leaves the bias to the kernel after it."""

    fold_bias: bool = False

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        front = self.front
        parts: list[Tensor] = []
        if front > 0:
            n_past = 0 if past is None else past.shape[2]
            if front > n_past:
                b, c, _, h, w = x.shape
                zeros = torch.zeros(b, c, front - n_past, h, w, dtype=x.dtype, device=x.device)
                parts.append(_like_layout(zeros, x))
            if past is not None and n_past:
                parts.append(past)
        if parts:
            x = torch.cat([*parts, x], dim=2)
        return self.conv(x)

    def conv(self, x: Tensor) -> Tensor:
        """The convolution of an input that already holds its temporal past and padding."""
        pw, _, ph, _ = self.spatial_pad
        bias = None if self.fold_bias else self.bias
        return F.conv3d(x, self.weight, bias, self.stride, (0, ph, pw), self.dilation, self.groups)


def pad_in_conv(vae: WanVAE) -> int:
    """Every CausalConv3d of `vae` becomes a PaddedCausalConv3d (in place); returns the count."""
    n = 0
    for module in vae.modules():
        if type(module) is CausalConv3d:
            module.__class__ = PaddedCausalConv3d
            n += 1
    return n


def bias_norm_silu(x: Tensor, bias: Tensor, gain: Tensor) -> Tensor:
    """SiLU(RMSNorm(x + bias)): the bias of the conv that produced x, added in float32."""
    y = x.float() + bias.view(-1, 1, 1, 1).float()
    return F.silu(F.normalize(y, dim=1) * gain.float()).to(x.dtype)


def bias_residual(y: Tensor, bias: Tensor, h: Tensor) -> Tensor:
    """y + bias + h in one pass (bias: conv2's plus the shortcut conv's, float32)."""
    return (y.float() + bias.view(-1, 1, 1, 1) + h.float()).to(y.dtype)


class BiasFoldedResidualBlock(ResidualBlock):
    """A ResidualBlock whose convs run without bias: conv1's is added inside the next
    RMSNorm + SiLU kernel, conv2's and the shortcut conv's inside the residual add."""

    norm_fn: Callable[[Tensor, Tensor, Tensor], Tensor]
    add_fn: Callable[[Tensor, Tensor, Tensor], Tensor]
    out_bias: Tensor

    def forward(self, x: Tensor, step) -> Tensor:  # noqa: ANN001 (CacheStep)
        norm1, _, conv1, norm2, _, _, conv2 = self.residual
        h = self.shortcut(x)
        y = conv1.stream(norm1(x), step)
        y = self.norm_fn(y, conv1.bias, norm2.gamma * norm2.scale)
        y = conv2.stream(y, step)
        return self.add_fn(y, self.out_bias, h)


def fold_conv_bias(vae: WanVAE, norm_fn: Callable = bias_norm_silu, add_fn: Callable = bias_residual) -> int:
    """Fold the residual blocks' conv biases into the kernels after the convs (in place; after
    `pad_in_conv` and `fuse_norm_silu`); returns the blocks changed."""
    n = 0
    for module in vae.modules():
        if type(module) is not ResidualBlock:
            continue
        conv1, norm2, conv2 = module.residual[2], module.residual[3], module.residual[6]
        assert isinstance(norm2, NormSiLU), "fold_conv_bias needs fuse_norm_silu first"
        assert isinstance(conv1, PaddedCausalConv3d) and isinstance(conv2, PaddedCausalConv3d), "pad_in_conv first"
        bias = conv2.bias.float()
        if isinstance(module.shortcut, PaddedCausalConv3d):
            bias = bias + module.shortcut.bias.float()
            module.shortcut.fold_bias = True
        conv1.fold_bias = conv2.fold_bias = True
        module.__class__ = BiasFoldedResidualBlock
        module.norm_fn, module.add_fn = norm_fn, add_fn
        module.out_bias = bias
        n += 1
    return n


def norm_silu_cat(x: Tensor, bias: Tensor | None, gain: Tensor, head: Tensor) -> Tensor:
    """cat(head, SiLU(RMSNorm(x [+ bias]))) over time: compiled, the norm writes its frames
    straight into the conv's input buffer (head: the cached frames, zeros where missing)."""
    y = x.float()
    if bias is not None:
        y = y + bias.view(-1, 1, 1, 1).float()
    a = F.silu(F.normalize(y, dim=1) * gain.float()).to(x.dtype)
    return torch.cat([head, a], dim=2)


class WrittenOnceResidualBlock(BiasFoldedResidualBlock):
    """BiasFoldedResidualBlock whose two conv inputs are each written once, by the kernel that
    computes them: RMSNorm + SiLU (+ the previous conv's bias) into one buffer that already
    holds the conv's cached frames; the next call's frames are cut from that buffer."""

    cat_fn: Callable[[Tensor, Tensor | None, Tensor, Tensor], Tensor]

    def forward(self, x: Tensor, step) -> Tensor:  # noqa: ANN001 (CacheStep)
        norm1, _, conv1, norm2, _, _, conv2 = self.residual
        h = self.shortcut(x)
        y = self._conv(conv1, x, None, norm1.gamma * norm1.scale, step)
        y = self._conv(conv2, y, conv1.bias, norm2.gamma * norm2.scale, step)
        return self.add_fn(y, self.out_bias, h)

    def _conv(self, conv: PaddedCausalConv3d, x: Tensor, bias: Tensor | None, gain: Tensor, step) -> Tensor:  # noqa: ANN001
        key = conv.cache_key
        assert key and key not in step.new, key
        prev = step.past.get(key)
        n_past = 0 if prev is None else prev.shape[2]
        missing = conv.front - n_past
        assert conv.front > 0 and missing >= 0, (conv.front, n_past)
        head = prev
        if missing:
            b, c, _, hh, ww = x.shape
            zeros = _like_layout(torch.zeros(b, c, missing, hh, ww, dtype=x.dtype, device=x.device), x)
            head = zeros if prev is None else torch.cat([zeros, prev], dim=2)
        buf = self.cat_fn(x, bias, gain, head)
        keep = min(CACHE_T, n_past + x.shape[2])  # CacheStep.swap's rule: the last frames of past ++ x
        step.new[key] = buf[:, :, buf.shape[2] - keep:].clone()
        return conv.conv(buf)


def write_once(vae: WanVAE, cat_fn: Callable = norm_silu_cat) -> int:
    """The bias-folded residual blocks write each conv input once (after `fold_conv_bias`)."""
    n = 0
    for module in vae.modules():
        if type(module) is BiasFoldedResidualBlock:
            module.__class__ = WrittenOnceResidualBlock
            module.cat_fn = cat_fn
            n += 1
    return n


def compiled(fn: Callable) -> Callable:
    """`fn` compiled with static shapes (see compiled_norm_silu)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, VAE_NORM_SHAPES)
    return torch.compile(fn, dynamic=False)
