"""Fixtures of the model tests: the tiny pipeline from the released-layout checkpoint, and
example 00's inputs."""
from __future__ import annotations

import numpy as np
import pytest

from model.conditioning import load_image_rgb
from model.pipeline import WorldPipeline
from support import EXAMPLES, TINY_CKPT, install_fake_cudnn


@pytest.fixture(scope="module")
def pipe(shared_dir) -> WorldPipeline:
    return WorldPipeline.load("tiny", str(TINY_CKPT))


@pytest.fixture(scope="module")
def example(shared_dir):
    """(image RGB uint8, prompt, poses [N, 4, 4], intrinsics [N, 4]) of example 00."""
    d = EXAMPLES / "00"
    return (load_image_rgb(d / "image.jpg"), (d / "prompt.txt").read_text(),
            np.load(d / "poses.npy"), np.load(d / "intrinsics.npy"))


@pytest.fixture
def fake_cudnn(monkeypatch):
    """cuDNN's FP8 SDPA as a stand-in computing what it is documented to compute (tests/support.py)."""
    return install_fake_cudnn(monkeypatch)
