"""Building blocks of the Wan 2.1 causal video VAE (spec C.2).

Module and parameter names follow the released `Wan2.1_VAE.pth` (e.g. `residual.{0,2,3,6}`,
`resample.1`, `time_conv`). Tensors are [1, C, t, h, w]. The operation order and memory
layouts mirror the reference so that float32 results match it bit for bit; blocks that carry
history across calls take a `CacheStep` (see vae_cache.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _triple

from model.vae.cache import CacheStep


def frames_to_batch(x: Tensor) -> Tensor:
    """[b, c, t, h, w] -> [b*t, c, h, w] (copy)."""
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def batch_to_frames(x: Tensor, t: int) -> Tensor:
    """[b*t, c, h, w] -> [b, c, t, h, w] (a permuted view, as the reference's rearrange)."""
    bt, c, h, w = x.shape
    return x.reshape(bt // t, t, c, h, w).permute(0, 2, 1, 3, 4)


class CausalConv3d(nn.Conv3d):
    """Conv3d whose temporal padding is all on the past side; the past comes from the cache.

    `cache_key` (the module path, set by WanVAE) names this conv's slot in a VaeCache.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        kernel: int | tuple[int, int, int],
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] = 0,
    ) -> None:
        super().__init__(in_dim, out_dim, kernel, stride, padding=0)
        pt, ph, pw = _triple(padding)
        self.front = 2 * pt  # frames of (cached or zero) past needed before the first input frame
        self.spatial_pad = (pw, pw, ph, ph)
        self.cache_key = ""

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """x [1, C, t, h, w]; past: the previous input frames of the stream, if any."""
        front = self.front
        if past is not None and front > 0:
            x = torch.cat([past, x], dim=2)
            front -= past.shape[2]
        x = F.pad(x, (*self.spatial_pad, front, 0))
        return super().forward(x)

    def stream(self, x: Tensor, step: CacheStep) -> Tensor:
        """Forward with this conv's history from `step`, recording the new one."""
        return self(x, step.swap(self.cache_key, x))


class RMSNorm(nn.Module):
    """Channel L2 normalisation times sqrt(C) and a learned per-channel gain (no bias)."""

    def __init__(self, dim: int, images: bool) -> None:
        super().__init__()
        # images: input [N, C, h, w], gain [C, 1, 1]; else input [1, C, t, h, w], gain [C, 1, 1, 1]
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


class ResidualBlock(nn.Module):
    """x + conv(silu(norm(conv(silu(norm(x)))))), 1x1x1 conv shortcut when the width changes."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(in_dim, images=False),
            nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMSNorm(out_dim, images=False),
            nn.SiLU(),
            nn.Identity(),  # the reference's Dropout(0.0); kept so the indices match the keys
            CausalConv3d(out_dim, out_dim, 3, padding=1),
        )
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: Tensor, step: CacheStep) -> Tensor:
        h = self.shortcut(x)
        norm1, act1, conv1, norm2, act2, _, conv2 = self.residual
        x = conv1.stream(act1(norm1(x)), step)
        x = conv2.stream(act2(norm2(x)), step)
        return x + h


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no temporal mixing)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        b, c, t, h, w = x.shape
        x = self.norm(frames_to_batch(x))  # [t, c, h, w]
        # [t, 3c, h, w] -> [t, 1, h*w, 3c] -> q, k, v [t, 1, h*w, c]
        qkv = self.to_qkv(x).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous()
        q, k, v = qkv.chunk(3, dim=-1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        x = self.proj(x)
        return batch_to_frames(x, t) + identity


class NearestUpsample2x(nn.Module):
    """Spatial x2 nearest-exact upsampling, computed in float32 (bf16-safe)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x.float(), scale_factor=(2.0, 2.0), mode="nearest-exact").type_as(x)


class Downsample(nn.Module):
    """Spatial /2 (pad right/bottom by 1, stride-2 3x3 conv); temporal /2 when `temporal`.

    Temporal: the first call of a stream passes its (single) frame through; later calls run a
    stride-2 3x1x1 conv over (last frame of the previous call ++ the call's frames).
    """

    def __init__(self, dim: int, temporal: bool) -> None:
        super().__init__()
        self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1)) if temporal else None

    def forward(self, x: Tensor, step: CacheStep) -> Tensor:
        t = x.shape[2]
        x = batch_to_frames(self.resample(frames_to_batch(x)), t)  # [1, c, t, h/2, w/2]
        if self.time_conv is not None:
            prev = step.swap(self.time_conv.cache_key, x, keep=1)
            if prev is not None:
                x = self.time_conv(torch.cat([prev, x], dim=2))  # [1, c, (t+1-3)//2+1, ...]
        return x


class Upsample(nn.Module):
    """Spatial x2 (nearest-exact + 3x3 conv, halving the width); temporal x2 when `temporal`.

    Temporal: the first call of a stream does not upsample in time (the reference's 'Rep'
    marker: 1 latent frame -> 1 video frame); later calls run a causal 3x1x1 conv to 2C
    channels whose halves become two consecutive frames. Its history starts empty at the
    second call, i.e. zero padding, as in the reference.
    """

    def __init__(self, dim: int, temporal: bool) -> None:
        super().__init__()
        self.resample = nn.Sequential(NearestUpsample2x(), nn.Conv2d(dim, dim // 2, 3, padding=1))
        self.time_conv = (
            CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0)) if temporal else None
        )

    def forward(self, x: Tensor, step: CacheStep) -> Tensor:
        b, c, t, h, w = x.shape
        if self.time_conv is not None:
            if step.first:
                step.swap(self.time_conv.cache_key, x[:, :, :0])  # history: no frames yet
            else:
                x = self.time_conv.stream(x, step)  # [1, 2c, t, h, w]
                # channel halves -> frame pairs:
                # [1, 2, c, t, h, w] -> [1, c, t, 2, h, w] -> [1, c, 2t, h, w]
                x = x.reshape(b, 2, c, t, h, w)
                x = torch.stack((x[:, 0], x[:, 1]), 3).reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        return batch_to_frames(self.resample(frames_to_batch(x)), t)


DIM_MULT = (1, 2, 4, 4)  # width multipliers of the 4 resolution levels (fixed by the release)
NUM_RES_BLOCKS = 2
TEMPORAL_DOWNSAMPLE = (False, True, True)  # per level transition; the decoder mirrors it


class Encoder3d(nn.Module):
    """Video [1, 3, t, H, W] -> [1, out_dim, t', H/8, W/8] (first call t' = t, later t/4)."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        dims = [dim * m for m in (1, *DIM_MULT)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)
        blocks: list[nn.Module] = []
        for level, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(NUM_RES_BLOCKS):
                blocks.append(ResidualBlock(d_in, d_out))
                d_in = d_out
            if level < len(DIM_MULT) - 1:
                blocks.append(Downsample(d_out, temporal=TEMPORAL_DOWNSAMPLE[level]))
        self.downsamples = nn.Sequential(*blocks)
        d = dims[-1]
        self.middle = nn.Sequential(ResidualBlock(d, d), AttentionBlock(d), ResidualBlock(d, d))
        self.head = nn.Sequential(
            RMSNorm(d, images=False), nn.SiLU(), CausalConv3d(d, out_dim, 3, padding=1)
        )

    def forward(self, x: Tensor, step: CacheStep) -> Tensor:
        x = self.conv1.stream(x, step)
        for block in self.downsamples:
            x = block(x, step)
        res1, attn, res2 = self.middle
        x = res2(attn(res1(x, step)), step)
        norm, act, conv = self.head
        return conv.stream(act(norm(x)), step)


class Decoder3d(nn.Module):
    """One latent frame [1, z_dim, 1, h, w] -> video [1, 3, n, 8h, 8w].

    n = 1 on a stream's first call, else 4.
    """

    def __init__(self, dim: int, z_dim: int) -> None:
        super().__init__()
        dims = [dim * m for m in (DIM_MULT[-1], *DIM_MULT[::-1])]
        temporal = TEMPORAL_DOWNSAMPLE[::-1]
        self.conv1 = CausalConv3d(z_dim, dims[0], 3, padding=1)
        d = dims[0]
        self.middle = nn.Sequential(ResidualBlock(d, d), AttentionBlock(d), ResidualBlock(d, d))
        blocks: list[nn.Module] = []
        for level, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            if level > 0:
                d_in //= 2  # the previous Upsample's spatial conv halved the width
            for _ in range(NUM_RES_BLOCKS + 1):
                blocks.append(ResidualBlock(d_in, d_out))
                d_in = d_out
            if level < len(DIM_MULT) - 1:
                blocks.append(Upsample(d_out, temporal=temporal[level]))
        self.upsamples = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            RMSNorm(dims[-1], images=False), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1)
        )

    def forward(self, x: Tensor, step: CacheStep) -> Tensor:
        x = self.conv1.stream(x, step)
        res1, attn, res2 = self.middle
        x = res2(attn(res1(x, step)), step)
        for block in self.upsamples:
            x = block(x, step)
        norm, act, conv = self.head
        return conv.stream(act(norm(x)), step)
