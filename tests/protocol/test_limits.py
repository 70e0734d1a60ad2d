"""Limits: documented defaults and self-validation."""
from __future__ import annotations

import dataclasses

import pytest

from protocol import DEFAULT_LIMITS, Limits


def test_defaults():
    assert DEFAULT_LIMITS == Limits()
    assert (Limits().max_message_bytes, Limits().max_image_bytes) == (16 << 20, 8 << 20)
    assert (Limits().max_image_pixels, Limits().min_image_side) == (8192 * 4096, 16)
    assert (Limits().max_prompt_chars, Limits().max_session_id_chars, Limits().max_poses_per_chunk) == (4096, 128, 48)
    assert Limits().rotation_tolerance == 1e-3


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Limits().max_prompt_chars = 1


@pytest.mark.parametrize("kwargs, match", [({"max_message_bytes": 0}, "max_message_bytes"),
                                           ({"max_poses_per_chunk": -1}, "max_poses_per_chunk"),
                                           ({"rotation_tolerance": 0.0}, "rotation_tolerance"),
                                           ({"rotation_tolerance": 1.0}, "rotation_tolerance")])
def test_invalid_limits(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Limits(**kwargs)
