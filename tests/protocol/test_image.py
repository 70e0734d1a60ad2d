"""Image intake: PNG/JPEG decode, decompression bombs, garbage, raw arrays."""
from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from protocol import ErrorCode, Limits, ProtocolError, decode_image, probe_image, raw_image

RGB = np.stack([*np.meshgrid(np.arange(40) * 6, np.arange(30) * 8, indexing="xy"), np.full((30, 40), 77)],
               axis=-1).astype(np.uint8)  # [30, 40, 3] smooth gradient


def save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_bomb(w: int, h: int) -> bytes:
    """A PNG whose header declares w x h RGB pixels, followed by a few bytes of zero-filled IDAT."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    idat = zlib.compressobj().compress(b"\x00" * 100_000)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def bad(data, limits: Limits = Limits()) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        decode_image(data, limits)
    return e.value


def test_png_decodes_exactly():
    got = decode_image(save(Image.fromarray(RGB), "PNG"))
    assert got.dtype == np.uint8 and got.shape == (30, 40, 3)
    np.testing.assert_array_equal(got, RGB)
    assert probe_image(save(Image.fromarray(RGB), "PNG")) == (30, 40)


def test_jpeg_decodes_close():
    got = decode_image(save(Image.fromarray(RGB), "JPEG", quality=95))
    assert got.shape == (30, 40, 3)
    assert np.abs(got.astype(int) - RGB).mean() < 3


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA", "I;16"])
def test_other_modes_become_rgb(mode):
    img = Image.fromarray(RGB).convert(mode)
    got = decode_image(save(img, "PNG"))
    assert got.shape == (30, 40, 3)
    np.testing.assert_array_equal(got, np.asarray(img.convert("RGB")))


def test_cmyk_jpeg_becomes_rgb():
    got = decode_image(save(Image.fromarray(RGB).convert("CMYK"), "JPEG", quality=95))
    assert got.shape == (30, 40, 3) and np.abs(got.astype(int) - RGB).mean() < 6


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's own, looser check
@pytest.mark.parametrize("w, h", [(30000, 30000), (10000, 10000), (8193, 4096)])
def test_bombs_are_rejected_from_the_header(w, h):
    data = png_bomb(w, h)
    t = time.perf_counter()
    err = bad(data)
    assert time.perf_counter() - t < 0.5  # nothing was decoded
    assert err.code is ErrorCode.BAD_IMAGE and "pixels" in err.message


def test_pixel_limit_is_exact():
    data = save(Image.fromarray(RGB), "PNG")
    assert decode_image(data, Limits(max_image_pixels=30 * 40)).shape == (30, 40, 3)
    assert "pixels" in bad(data, Limits(max_image_pixels=30 * 40 - 1)).message


def test_too_small_and_too_many_bytes():
    assert bad(save(Image.new("RGB", (15, 100)), "PNG")).code is ErrorCode.BAD_IMAGE
    data = save(Image.fromarray(RGB), "PNG")
    assert bad(data, Limits(max_image_bytes=len(data) - 1)).code is ErrorCode.TOO_LARGE


@pytest.mark.parametrize("data", [b"", b"garbage", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"\xff\xd8\xff" + b"\x00" * 40,
                                  save(Image.fromarray(RGB), "GIF"), save(Image.fromarray(RGB), "BMP"),
                                  save(Image.fromarray(RGB), "WEBP")])
def test_garbage_and_other_formats(data):
    assert bad(data).code is ErrorCode.BAD_IMAGE


def test_truncated_png_passes_the_probe_but_not_the_decode():
    data = save(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)), "PNG")
    assert probe_image(data[: len(data) // 2]) == (64, 64)
    err = bad(data[: len(data) // 2])
    assert err.code is ErrorCode.BAD_IMAGE and "truncated" in err.message


def test_raw_arrays():
    np.testing.assert_array_equal(decode_image(RGB), RGB)
    np.testing.assert_array_equal(raw_image(RGB.astype(np.int64)), RGB)
    for arr in (RGB[..., :2], RGB[0], RGB.astype(np.float32), RGB.astype(np.int16) - 1, RGB.astype(bool),
                np.zeros((8, 40, 3), np.uint8)):
        assert bad(arr).code is ErrorCode.BAD_IMAGE


@st.composite
def mutated_image(draw: st.DrawFn) -> bytes:
    fmt = draw(st.sampled_from(["PNG", "JPEG"]))
    data = bytearray(save(Image.fromarray(RGB), fmt))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if draw(st.booleans()):
            data[i] = draw(st.integers(0, 255))
        else:
            del data[i: i + draw(st.integers(1, 64))]
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(mutated_image())
def test_mutated_files_give_an_image_or_bad_image(data):
    try:
        out = decode_image(data)
    except ProtocolError as e:
        assert e.code is ErrorCode.BAD_IMAGE
    else:
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
