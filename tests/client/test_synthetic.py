"""Synthetic trajectories: valid rigid OpenCV camera-to-world transforms of the intended shape."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from client.synthetic import default_image, default_intrinsics, dolly, orbit, pan, synthetic_trajectory
from client.trajectory import plan_session
from protocol.codec import decode


def assert_rigid(poses: np.ndarray) -> None:
    p = poses.astype(np.float64)
    rot = p[:, :3, :3]
    np.testing.assert_allclose(np.swapaxes(rot, 1, 2) @ rot, np.broadcast_to(np.eye(3), rot.shape), atol=1e-6)
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-6)
    np.testing.assert_array_equal(p[:, 3], np.broadcast_to([0.0, 0.0, 0.0, 1.0], (len(p), 4)))


@pytest.mark.parametrize("poses", [orbit(33), orbit(81, degrees=-120, radius=2.5), dolly(33), dolly(20, -3.0),
                                   pan(33), pan(9, -90.0)])
def test_valid_rigid_transforms_starting_at_identity(poses):
    assert poses.dtype == np.float32 and poses.shape[1:] == (4, 4)
    assert_rigid(poses)
    np.testing.assert_allclose(poses[0], np.eye(4), atol=1e-7)


def test_orbit_keeps_looking_at_the_target():
    radius = 3.0
    poses = orbit(21, degrees=90.0, radius=radius).astype(np.float64)
    target = np.array([0.0, 0.0, radius])
    forward = poses[:, :3, 2]  # camera z axis in world coordinates (OpenCV: forward)
    centres = poses[:, :3, 3]
    np.testing.assert_allclose(centres + radius * forward, np.broadcast_to(target, centres.shape), atol=1e-5)
    # the last camera has turned 90 degrees right: it looks along world +x from the target's left
    np.testing.assert_allclose(forward[-1], [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(centres[-1], [-radius, 0.0, radius], atol=1e-5)


def test_dolly_moves_along_the_optical_axis():
    poses = dolly(11, distance=2.0).astype(np.float64)
    np.testing.assert_allclose(poses[:, :3, :3], np.broadcast_to(np.eye(3), (11, 3, 3)))
    np.testing.assert_allclose(poses[:, :3, 3], np.stack([np.zeros(11), np.zeros(11), np.linspace(0, 2, 11)], 1),
                               atol=1e-6)


def test_pan_turns_in_place_to_the_right():
    poses = pan(5, degrees=40.0).astype(np.float64)
    np.testing.assert_allclose(poses[:, :3, 3], 0.0)
    yaw = np.degrees(np.arctan2(poses[:, 0, 2], poses[:, 2, 2]))  # heading of the forward axis, + = right
    np.testing.assert_allclose(yaw, [0.0, 10.0, 20.0, 30.0, 40.0], atol=1e-4)
    np.testing.assert_allclose(poses[:, 1, 2], 0.0, atol=1e-7)  # no tilt


def test_default_image_and_intrinsics():
    png = default_image()
    img = np.asarray(Image.open(io.BytesIO(png)))
    assert img.shape == (480, 832, 3) and img.std() > 20  # a picture, not a flat fill
    np.testing.assert_array_equal(default_intrinsics(2), [[500, 500, 416, 240]] * 2)


@pytest.mark.parametrize("kind", ["orbit", "dolly", "pan"])
def test_every_chunk_request_passes_the_server_intake(kind):
    traj = synthetic_trajectory(kind, 33)
    plan = plan_session(traj, 33)
    requests = [decode(m) for m in traj.messages(plan, "s")]
    assert len(requests) == 3 and requests[0].prompt == traj.prompt and requests[0].num_frames == 33
    for req, poses in zip(requests, plan.chunk_poses):
        np.testing.assert_array_equal(req.cameras.poses, poses)
    # a turn in place has no translation to normalise: no translation_scale is declared
    assert (requests[0].translation_scale is None) == (kind == "pan")


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="radius"):
        orbit(9, radius=0.0)
    with pytest.raises(ValueError, match="frames"):
        pan(0)
    with pytest.raises(ValueError, match="kind"):
        synthetic_trajectory("spin", 9)
