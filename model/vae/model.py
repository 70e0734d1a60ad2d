"""WanVAE: the Wan 2.1 causal video VAE (spec C.2) with explicit streaming caches.

The module holds weights only. A stream (the conditioning encode of one session, or its
decode) carries a `VaeCache` from call to call::

    cache = VaeCache.empty()
    z, cache = vae.encode_chunk(video[3, 1 + 4k, h, w], cache)    # then 4k frames per call
    cache = VaeCache.empty()
    x, cache = vae.decode_chunk(z[16, t, lh, lw], cache)          # 1 + 4(t-1) frames, then 4t

Like the reference, the encoder runs frame 0 alone and then groups of 4 frames, and the
decoder runs one latent frame at a time; a chunked stream with a persistent cache therefore
equals the whole-video call exactly (spec H, "VAE caches").
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from model.checkpoint import assign_state_dict, load_pth, shape_of
from model.config import VAEConfig
from model.vae.blocks import CausalConv3d, Decoder3d, Encoder3d
from model.vae.cache import CacheStep, VaeCache

# Per-channel latent statistics of the released VAE (spec C.2): z = (mu - mean) / std.
LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip
TIME_STRIDE = 4  # video frames per latent frame (after the first)
SPACE_STRIDE = 8  # pixels per latent pixel


class WanVAE(nn.Module):
    """Encoder, decoder and the 1x1x1 convs around the latent; keys == Wan2.1_VAE.pth.

    `batch_frames` (off: the reference's call pattern, the goldens' path): after a stream's
    first frame, all frames of a chunk go through the encoder / decoder in one call instead of
    one call per latent frame. The same function (every temporal op is causal with its history
    in the cache; the temporal up/downsampling's windows do not depend on where a call starts),
    fewer and larger calls: each conv's history is copied in and cut out once per chunk, not
    once per latent frame (`AccelOptions.vae_batch_frames`).
    """

    batch_frames: bool = False

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        if cfg.z_dim != len(LATENT_MEAN):
            raise ValueError(
                f"z_dim must be {len(LATENT_MEAN)} (the latent statistics), got {cfg.z_dim}"
            )
        self.cfg = cfg
        self.encoder = Encoder3d(cfg.dim, cfg.z_dim * 2)
        self.conv1 = CausalConv3d(cfg.z_dim * 2, cfg.z_dim * 2, 1)  # -> (mu, log_var)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg.dim, cfg.z_dim)
        for name, module in self.named_modules():
            if isinstance(module, CausalConv3d) and module.kernel_size[0] > 1:
                module.cache_key = name  # names the conv's slot in a VaeCache

    @property
    def dtype(self) -> torch.dtype:
        return self.conv1.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.conv1.weight.device

    @property
    def latent_stats(self) -> tuple[Tensor, Tensor]:
        """(mean, std) float32 [z_dim] on the weights' device."""
        kw = dict(dtype=torch.float32, device=self.device)
        return torch.tensor(LATENT_MEAN, **kw), torch.tensor(LATENT_STD, **kw)

    @torch.no_grad()
    def encode_chunk(self, video: Tensor, cache: VaeCache) -> tuple[Tensor, VaeCache]:
        """video [3, T, h, w] in [-1, 1] -> (latent float32 [z_dim, t, h/8, w/8], next cache).

        The latent is normalised ((mu - mean) / std).

        A stream's first call takes T = 1 + 4k frames (t = 1 + k), later calls T = 4k (t = k).
        """
        size = _check_video(video, cache)
        x = video.to(device=self.device, dtype=self.dtype)[None]  # [1, 3, T, h, w]
        # frame 0 alone on a stream's first call, then groups of 4 frames (-> 1 latent frame each)
        outs = []
        for start, end in _groups(x.shape[2], cache.is_empty, TIME_STRIDE, self.batch_frames):
            step = CacheStep(cache.frames)
            outs.append(self.encoder(x[:, :, start:end], step))
            cache = step.finish("encoder", size)
        mu = self.conv1(torch.cat(outs, dim=2))[:, : self.cfg.z_dim]  # [1, z_dim, t, h/8, w/8]
        mean, std = self.latent_stats
        z = (mu - mean.view(1, -1, 1, 1, 1)) * (1.0 / std).view(1, -1, 1, 1, 1)
        return z[0].float(), cache

    @torch.no_grad()
    def decode_chunk(self, z: Tensor, cache: VaeCache) -> tuple[Tensor, VaeCache]:
        """Normalised latent [z_dim, t, lh, lw] -> (video float32 [3, n, 8lh, 8lw], next cache).

        The video is clamped to [-1, 1].
        n = 1 + 4(t - 1) on a stream's first call, 4t later.
        """
        size = _check_latent(z, self.cfg.z_dim, cache)
        mean, std = self.latent_stats
        z = z.to(device=self.device, dtype=torch.float32)[None]  # [1, z_dim, t, lh, lw]
        # the reference multiplies by 1/std on encode and divides by it here
        z = z / (1.0 / std).view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
        x = self.conv2(z.to(self.dtype))
        outs = []
        for start, end in _groups(x.shape[2], cache.is_empty, 1, self.batch_frames):
            step = CacheStep(cache.frames)
            outs.append(self.decoder(x[:, :, start:end], step))
            cache = step.finish("decoder", size)
        video = torch.cat(outs, dim=2)[0].float().clamp(-1.0, 1.0)  # [3, n, 8lh, 8lw]
        return video, cache

    def encode(self, video: Tensor) -> Tensor:
        """Whole video [3, 1 + 4k, h, w] -> latent [z_dim, 1 + k, h/8, w/8] (fresh cache)."""
        return self.encode_chunk(video, VaeCache.empty())[0]

    def decode(self, z: Tensor) -> Tensor:
        """Whole latent [z_dim, t, lh, lw] -> video [3, 1 + 4(t-1), 8lh, 8lw] (fresh cache)."""
        return self.decode_chunk(z, VaeCache.empty())[0]


def _groups(n: int, first: bool, step: int, batched: bool) -> list[tuple[int, int]]:
    """[start, end) of the encoder / decoder calls over n frames: frame 0 alone on a stream's
    first call, then `step` frames per call, or (batched) all the rest in one."""
    start = 1 if first else 0
    head = [(0, 1)] if first else []
    if batched:
        return head + ([(start, n)] if n > start else [])
    return head + [(i, i + step) for i in range(start, n, step)]


def _check_video(video: Tensor, cache: VaeCache) -> tuple[int, int]:
    if video.ndim != 4 or video.shape[0] != 3 or not video.is_floating_point():
        raise ValueError(
            f"video must be a float tensor [3, T, h, w], got {tuple(video.shape)} {video.dtype}"
        )
    _, n, h, w = video.shape
    if h % SPACE_STRIDE or w % SPACE_STRIDE:
        raise ValueError(f"video height and width must be multiples of {SPACE_STRIDE}: {h}x{w}")
    if cache.is_empty and n % TIME_STRIDE != 1:
        raise ValueError(f"the first chunk of an encoder stream needs 1 + 4k frames, got {n}")
    if not cache.is_empty and (n == 0 or n % TIME_STRIDE):
        raise ValueError(f"later chunks of an encoder stream need 4k frames (k >= 1), got {n}")
    cache.check("encoder", (h, w))
    return h, w


def _check_latent(z: Tensor, z_dim: int, cache: VaeCache) -> tuple[int, int]:
    if z.ndim != 4 or z.shape[0] != z_dim or z.shape[1] == 0 or not z.is_floating_point():
        raise ValueError(
            f"latent must be a float tensor [{z_dim}, t>=1, h, w], got {tuple(z.shape)}"
        )
    size = (z.shape[2], z.shape[3])
    cache.check("decoder", size)
    return size


def load_vae(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> WanVAE:
    """Load `Wan2.1_VAE.pth` (dims read from the tensor shapes); CheckpointError on mismatch."""
    path = Path(path)
    sd = load_pth(path)
    cfg = VAEConfig(
        dim=shape_of(sd, "encoder.conv1.weight", path)[0],
        z_dim=shape_of(sd, "conv2.weight", path)[0],
    )
    with torch.device("meta"):
        vae = WanVAE(cfg)
    assign_state_dict(vae, sd, path, dtype, device)
    return vae.eval()


@torch.no_grad()
def init_vae_random(
    cfg: VAEConfig, dtype: torch.dtype, device: torch.device | str, seed: int
) -> WanVAE:
    """Seeded random weights built on `device` (for the embedded tiny model and benchmarks).

    Conv weights ~ N(0, 1/fan_in), biases ~ N(0, 0.02^2), norm gains 1. The values depend
    on the device's generator, so they are reproducible per device type.
    """
    with torch.device("meta"):
        vae = WanVAE(cfg)
    vae.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in vae.named_parameters():
        if name.endswith("gamma"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.normal_(0.0, p[0].numel() ** -0.5, generator=gen)
    return vae.to(dtype).requires_grad_(False).eval()
