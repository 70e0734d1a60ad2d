"""model/conditioning.py: image loading/preprocessing and the y condition against the goldens."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from camera import output_size
from model.conditioning import image_condition_mask, load_image_rgb, make_y, preprocess_image
from support import EXAMPLES, GOLDEN_FILES, load_golden, rel_err

GOLDEN_NAMES = [p.name for p in GOLDEN_FILES]


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_preprocess_matches_golden_image(name):
    g = load_golden(name)
    m = g["meta"]
    img = load_image_rgb(EXAMPLES / m["example"] / "image.jpg")
    h, w = output_size(m["max_area"], img.shape[0], img.shape[1])
    assert (h, w) == (m["height"], m["width"])
    x = preprocess_image(img, h, w)
    assert x.shape == (3, h, w) and x.dtype == torch.float32
    # Pillow's libjpeg may move a level on another build; 1e-5 is far below one level (2/255)
    assert rel_err(x, g["image"]) <= 1e-5


def test_load_image_from_bytes_and_modes():
    rgba = np.zeros((5, 7, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 255
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    img = load_image_rgb(buf.getvalue())
    assert img.shape == (5, 7, 3) and img.dtype == np.uint8
    assert (img[..., 0] == 200).all() and (img[..., 1:] == 0).all()
    with pytest.raises(ValueError):
        load_image_rgb(b"not an image")


def test_preprocess_identity_size_is_affine_map():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(8, 16, 3), dtype=np.uint8)
    x = preprocess_image(img, 8, 16)  # same size: bicubic at the pixel centres is the identity
    want = torch.from_numpy(img).permute(2, 0, 1).double() / 255 * 2 - 1
    assert (x.double() - want).abs().max() < 1e-6
    with pytest.raises(ValueError):
        preprocess_image(img.astype(np.float32), 8, 16)


def test_bicubic_overshoot_is_not_clamped():
    step = np.zeros((4, 8, 3), dtype=np.uint8)
    step[:, 4:] = 255
    x = preprocess_image(step, 8, 16)
    assert x.min() < -1.01 and x.max() > 1.01


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_y_matches_golden(name):
    g = load_golden(name)
    m = g["meta"]
    latent = g["vae_encode"]["latent"]
    for c, chunk in enumerate(g["chunks"]):
        mask = image_condition_mask(3, c == 0, m["lat_h"], m["lat_w"])
        y = make_y(mask, latent[:, 3 * c : 3 * c + 3])
        assert y.shape == (20, 3, m["lat_h"], m["lat_w"])
        assert torch.equal(y, chunk["y"])


def test_mask_only_on_first_latent_frame_of_first_chunk():
    first = image_condition_mask(3, True, 2, 3)
    assert first.shape == (4, 3, 2, 3)
    assert (first[:, 0] == 1).all() and (first[:, 1:] == 0).all()
    assert (image_condition_mask(3, False, 2, 3) == 0).all()
    with pytest.raises(ValueError):
        make_y(first, torch.zeros(16, 2, 2, 3))
