"""Image conditioning (spec B.3): the resized first frame and the 20-channel y of a chunk.

y = channel-concat(mask [4, f, lh, lw], latent [16, f, lh, lw]); the mask is 1 only on latent
frame 0 of chunk 0 (the frame that the conditioning image occupies), 0 elsewhere.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

MASK_CHANNELS = 4  # the VAE's temporal stride: one mask channel per video frame of a latent
LATENT_CHANNELS = 16


def load_image_rgb(source: str | Path | bytes) -> np.ndarray:
    """Decode an image file or encoded bytes with Pillow -> RGB uint8 [H0, W0, 3]."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"cannot decode image: {exc}") from exc


def preprocess_image(image: np.ndarray, h: int, w: int) -> torch.Tensor:
    """RGB uint8 [H0, W0, 3] -> float32 [3, h, w] in about [-1, 1].

    to_tensor * 2 - 1, then bicubic resize (align_corners False, no antialias) and NOT
    clamped, as the reference: values slightly outside [-1, 1] are kept.
    """
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be RGB uint8 [H, W, 3], got {image.dtype} {image.shape}")
    if not image.flags.writeable:  # e.g. a zero-copy array from Ray's object store
        image = image.copy()
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255)  # [3, H0, W0] in [0, 1]
    x = x * 2 - 1
    return F.interpolate(x[None], size=(h, w), mode="bicubic", align_corners=False)[0]


def image_condition_mask(lat_f: int, is_first_chunk: bool, lat_h: int, lat_w: int) -> torch.Tensor:
    """Mask channels of one chunk -> float32 [4, lat_f, lat_h, lat_w]."""
    mask = torch.zeros(MASK_CHANNELS, lat_f, lat_h, lat_w)
    if is_first_chunk:
        mask[:, 0] = 1.0
    return mask


def make_y(mask: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
    """y of one chunk: mask [4, f, lh, lw] + VAE latent [16, f, lh, lw] -> [20, f, lh, lw]."""
    if (
        mask.shape[0] != MASK_CHANNELS
        or latent.shape[0] != LATENT_CHANNELS
        or mask.shape[1:] != latent.shape[1:]
    ):
        raise ValueError(
            f"need mask [4, f, h, w] and latent [16, f, h, w] of one chunk, "
            f"got {tuple(mask.shape)} and {tuple(latent.shape)}"
        )
    return torch.cat([mask.to(latent), latent], dim=0)
