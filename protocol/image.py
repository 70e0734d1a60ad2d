"""Image intake: PNG/JPEG bytes or a raw array -> RGB uint8 [H, W, 3], with pixel limits.

The pixel count is read from the header (`Image.open` is lazy) and checked BEFORE the pixels
are decoded, so a small file that declares a huge canvas (a decompression bomb) costs nothing.
Only the PNG and JPEG parsers of Pillow are enabled.
"""
from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits

FORMATS = ("PNG", "JPEG")
# What Pillow raises on malformed or truncated files (UnidentifiedImageError is an OSError).
_PILLOW_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError,
                  NotImplementedError, OverflowError, Image.DecompressionBombError)


def _check_size(h: int, w: int, limits: Limits) -> None:
    if h * w > limits.max_image_pixels:
        raise ProtocolError(ErrorCode.BAD_IMAGE, f"image is {w}x{h} = {h * w} pixels; at most "
                                                 f"{limits.max_image_pixels} are accepted, downscale it")
    if min(h, w) < limits.min_image_side:
        raise ProtocolError(ErrorCode.BAD_IMAGE, f"image is {w}x{h}; both sides must be at least "
                                                 f"{limits.min_image_side} pixels")
    if max(h, w) > limits.max_aspect_ratio * min(h, w):
        raise ProtocolError(ErrorCode.BAD_IMAGE, f"image is {w}x{h}, an aspect ratio of "
                                                 f"{max(h, w) / min(h, w):.1f}:1; at most "
                                                 f"{limits.max_aspect_ratio:g}:1 is accepted, crop it")


def _open(data: bytes, limits: Limits) -> Image.Image:
    if len(data) > limits.max_image_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"image is {len(data)} bytes; at most "
                                                 f"{limits.max_image_bytes} are accepted, recompress it")
    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise ProtocolError(ErrorCode.BAD_IMAGE, "image declares far too many pixels "
                                                 f"(limit {limits.max_image_pixels})") from None
    except _PILLOW_ERRORS:
        raise ProtocolError(ErrorCode.BAD_IMAGE, "image is not a readable PNG or JPEG file") from None
    w, h = im.size
    _check_size(h, w, limits)
    return im


def probe_image(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int]:
    """(h, w) from the PNG/JPEG header; rejects unreadable headers and oversized images."""
    with _open(data, limits) as im:
        return im.size[1], im.size[0]


def raw_image(arr: np.ndarray, limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    """Validate a raw RGB array [H, W, 3] of integers in 0..255; returns C-contiguous uint8."""
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ProtocolError(ErrorCode.BAD_IMAGE, f"raw image must be RGB [H, W, 3], got shape {list(arr.shape)}")
    _check_size(arr.shape[0], arr.shape[1], limits)
    if arr.dtype.kind not in "iu":
        raise ProtocolError(ErrorCode.BAD_IMAGE, f"raw image must be uint8, got dtype {arr.dtype.str}")
    if arr.dtype != np.uint8 and (arr.min() < 0 or arr.max() > 255):
        raise ProtocolError(ErrorCode.BAD_IMAGE, "raw image values must be in 0..255 (uint8)")
    return np.ascontiguousarray(arr, dtype=np.uint8)


def decode_image(image: bytes | np.ndarray, limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    """PNG/JPEG bytes or a raw array -> RGB uint8 [H, W, 3].

    Raises ProtocolError: bad_image (unreadable, too many pixels, too small) or too_large
    (more than `limits.max_image_bytes` encoded bytes).
    """
    if isinstance(image, np.ndarray):
        return raw_image(image, limits)
    with _open(image, limits) as im:
        try:
            rgb = im.convert("RGB")  # decodes; palette/gray/alpha/CMYK -> RGB as the reference's PIL load
        except _PILLOW_ERRORS:
            raise ProtocolError(ErrorCode.BAD_IMAGE, "image data is corrupt or truncated; "
                                                     "send a complete PNG or JPEG file") from None
    out = np.asarray(rgb, dtype=np.uint8)
    assert out.shape == (im.size[1], im.size[0], 3)
    return out
