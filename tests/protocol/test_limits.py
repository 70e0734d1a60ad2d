"""Limits: the defaults admit what the reference runs; invalid settings are refused."""
from __future__ import annotations

import numpy as np
import pytest

from camera import CHUNK_VIDEO_FRAMES, DEFAULT_SIZE, MAX_NUM_FRAMES, chunk_cameras, parse_size
from protocol import DEFAULT_LIMITS, Limits, ProtocolError, decode, decode_image
from protocol.codec import encode, validated
from protocol.messages import InferRequest
from protocol.requests import SessionStart, infer_request
from support import EXAMPLES

EXAMPLE_IDS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "poses.npy").is_file())


@pytest.mark.parametrize("example", EXAMPLE_IDS)
def test_defaults_accept_the_reference_runs(example):
    """Every shipped example, as the reference runs it (its image file, 81 frames at 480*832,
    a whole 12-pose chunk slice), is one valid first infer under the default limits."""
    folder = EXAMPLES / example
    image = next(folder / n for n in ("image.jpg", "image.png") if (folder / n).is_file()).read_bytes()
    poses, intrinsics = chunk_cameras(np.load(folder / "poses.npy"), np.load(folder / "intrinsics.npy"), 0)
    start = SessionStart(image, (folder / "prompt.txt").read_text(encoding="utf-8"), size=DEFAULT_SIZE, num_frames=81)
    data = encode(infer_request("s", poses, intrinsics, start=start))
    assert len(data) <= DEFAULT_LIMITS.max_message_bytes
    req = decode(data)
    assert req.max_area == parse_size(DEFAULT_SIZE) and req.cameras.poses.shape == (CHUNK_VIDEO_FRAMES, 4, 4)
    assert decode_image(req.image).ndim == 3


def test_defaults_accept_the_longest_session_the_model_can_run():
    pose = np.eye(4, dtype=np.float32)[None]
    k = np.array([[500.0, 500.0, 416.0, 240.0]])
    cameras = {"poses": pose, "intrinsics": k}
    assert decode(encode(validated(InferRequest, {"session_id": "s", "cameras": cameras, "num_frames": MAX_NUM_FRAMES}))
                  ).num_frames == MAX_NUM_FRAMES
    with pytest.raises(ProtocolError):
        validated(InferRequest, {"session_id": "s", "cameras": cameras, "num_frames": MAX_NUM_FRAMES + 4})


@pytest.mark.parametrize("kwargs, match", [({"max_message_bytes": 0}, "max_message_bytes"),
                                           ({"max_poses_per_chunk": -1}, "max_poses_per_chunk"),
                                           ({"rotation_tolerance": 0.0}, "rotation_tolerance"),
                                           ({"rotation_tolerance": 1.0}, "rotation_tolerance")])
def test_invalid_limits(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Limits(**kwargs)
