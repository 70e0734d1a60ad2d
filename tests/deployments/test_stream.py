"""Stream: lifecycle transitions and per-incarnation keys."""
from __future__ import annotations

import numpy as np
import pytest

from deployments.stream import Stream, StreamClosed, StreamSpec, StreamState, image_digest

SPEC = StreamSpec(session_id="s", prompt="p", image_digest="d", resolution=(32, 48), seed=42,
                  total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))


def test_lifecycle():
    s = Stream(SPEC)
    assert [s.take_chunk_id() for _ in range(3)] == [0, 1, 2]
    assert s.fail() and s.state is StreamState.FAILED
    assert not s.fail()  # released once
    with pytest.raises(StreamClosed):
        s.take_chunk_id()
    assert not s.close()  # a failed stream was already released
    with pytest.raises(StreamClosed):
        s.close()
    t = Stream(SPEC)
    assert t.close() and t.state is StreamState.CLOSED


def test_every_incarnation_has_its_own_key():
    a, b = Stream(SPEC), Stream(SPEC)
    assert a.key != b.key and a.key.startswith("s~") and b.key.startswith("s~")


def test_image_digest_tells_images_apart():
    img = np.zeros((4, 4, 3), np.uint8)
    assert image_digest(img) == image_digest(img.copy())
    assert image_digest(img) != image_digest(img.reshape(8, 2, 3))  # same bytes, other shape
    assert image_digest(b"png") != image_digest(b"jpg")
