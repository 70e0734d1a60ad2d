"""camera/poses.py: pose checks, interpolation, relative poses, translation scale, chunking."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from camera import (
    chunk_cameras,
    chunk_latent_poses,
    frame_plan,
    interpolate_poses,
    offline_latent_poses,
    relative_poses,
    rescale_intrinsics,
    rigid_errors,
    scale_translations,
    translation_norms,
    translation_scale,
)
from support import EXAMPLES

EXAMPLE_IDS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "poses.npy").is_file())


def rigid(rotvec, t) -> np.ndarray:
    """A float32 c2w pose from a rotation vector and a translation."""
    p = np.eye(4)
    p[:3, :3] = Rotation.from_rotvec(rotvec).as_matrix()
    p[:3, 3] = t
    return p.astype(np.float32)


def analytic_poses(frames, omega=np.array([0.0, 0.02, 0.01]), v=np.array([0.3, -0.1, 1.0])):
    """Constant-rate rotation and constant velocity sampled at (fractional) frames."""
    return np.stack([rigid(omega * f, v * f) for f in frames])


def rot_z(degrees: float) -> np.ndarray:
    return Rotation.from_euler("z", degrees, degrees=True).as_matrix()


def random_poses(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rigid(rng.normal(size=3), rng.normal(size=3) * 10) for _ in range(n)])


def test_rigid_errors_measure_the_distance_from_a_rigid_transform():
    pose = rigid([0.3, -0.2, 0.1], [1.0, 2.0, 3.0])
    ortho, det, last = rigid_errors(pose[None])
    assert ortho[0] < 1e-6 and abs(det[0] - 1.0) < 1e-6 and last[0] == 0.0
    scaled, mirrored, projective = pose.copy(), pose.copy(), pose.copy()
    scaled[:3, :3] *= 1.01  # R^T R = 1.0201 I
    mirrored[:, 0] *= -1  # det -1
    projective[3, 2] = 0.5
    ortho, det, last = rigid_errors(np.stack([scaled, mirrored, projective]))
    assert ortho[0] == pytest.approx(0.0201, rel=1e-4) and det[1] == pytest.approx(-1.0, abs=1e-6)
    assert last[2] == 0.5 and last[0] == last[1] == 0.0


def test_interpolation_at_integer_positions_returns_inputs():
    poses = random_poses(7)
    out = interpolate_poses(poses, np.arange(7.0))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, poses, atol=2e-6)


def test_slerp_midpoint_and_linear_translation():
    poses = np.stack([rigid([0, 0, 0], [0, 0, 0]), rigid([0, 0, np.pi / 2], [2, 4, -6])])
    mid = interpolate_poses(poses, np.array([0.5, 0.25]))
    np.testing.assert_allclose(mid[0, :3, :3], rot_z(45), atol=1e-6)
    np.testing.assert_allclose(mid[0, :3, 3], [1, 2, -3], atol=1e-6)
    np.testing.assert_allclose(mid[1, :3, :3], rot_z(22.5), atol=1e-6)
    np.testing.assert_allclose(mid[:, 3], [[0, 0, 0, 1]] * 2)
    # 170 deg -> 340 deg: the short way through 255 deg (quaternion signs made continuous)
    poses = np.stack([rigid([0, 0, np.radians(a)], [0, 0, 0]) for a in (0, 170, 340)])
    out = interpolate_poses(poses, np.array([1.5]))
    np.testing.assert_allclose(out[0, :3, :3], rot_z(255), atol=1e-6)
    with pytest.raises(ValueError):
        interpolate_poses(poses, np.array([2.5]))


def test_relative_poses_of_a_pure_translation():
    poses = np.stack([rigid([0, 0, 0], [0.5 * k, 0, 2.0 * k]) for k in range(5)])
    rel = relative_poses(poses)
    np.testing.assert_array_equal(rel[0], np.eye(4))
    for k in range(1, 5):
        np.testing.assert_allclose(rel[k], rigid([0, 0, 0], [0.5, 0, 2.0]), atol=1e-6)
    scaled = scale_translations(rel)
    np.testing.assert_allclose(translation_norms(scaled)[1:], 1.0, rtol=1e-6)
    np.testing.assert_allclose(scale_translations(rel, 4.0)[1:, 2, 3], 0.5, rtol=1e-6)
    still = scale_translations(relative_poses(np.repeat(poses[:1], 3, axis=0)))
    np.testing.assert_array_equal(still, np.broadcast_to(np.eye(4), (3, 4, 4)))  # max 0: no scaling


def test_relative_poses_match_float64_and_chain_across_chunks():
    poses = random_poses(9, seed=3)
    rel = relative_poses(poses)
    want = [np.linalg.inv(poses[k - 1].astype(np.float64)) @ poses[k] for k in range(1, 9)]
    np.testing.assert_allclose(rel[1:], np.stack(want), atol=1e-4)
    # chunk by chunk (previous pose + session anchor) equals the whole trajectory bit for bit
    parts = [relative_poses(poses[:3])]
    for s in (3, 6):
        parts.append(relative_poses(poses[s : s + 3], prev=poses[s - 1], anchor=poses[0]))
    np.testing.assert_array_equal(np.concatenate(parts), rel)
    with pytest.raises(ValueError):
        relative_poses(poses[3:6], prev=poses[2])


def test_translation_scale_of_a_uniform_motion():
    poses = analytic_poses(np.arange(21), omega=np.zeros(3), v=np.array([0.0, 0.6, 0.8]))
    # 21 frames -> latent poses at frames 0, 4, ..., 20: each step moves 4 * |v| = 4
    assert translation_scale(poses, 21) == pytest.approx(4.0, rel=1e-6)
    # 29 frames -> 6 latent poses spread over 28 frames: 5.6 frames per step
    poses = analytic_poses(np.arange(40), omega=np.zeros(3), v=np.array([0.0, 0.6, 0.8]))
    assert translation_scale(poses, 29) == pytest.approx(5.6, rel=1e-6)


@pytest.mark.parametrize("example", EXAMPLE_IDS)
def test_translation_scale_matches_float64_on_examples(example):
    poses = np.load(EXAMPLES / example / "poses.npy")
    latent = offline_latent_poses(poses, 81).astype(np.float64)
    want = max(np.linalg.norm((np.linalg.inv(a) @ b)[:3, 3]) for a, b in zip(latent[:-1], latent[1:]))
    # float32 rounding of the reference (anchored at the first pose) against exact float64
    assert translation_scale(poses, 81) == pytest.approx(want, rel=2e-4)


@pytest.mark.parametrize("example", EXAMPLE_IDS)
def test_chunk_slicing_round_trips(example):
    poses = np.load(EXAMPLES / example / "poses.npy")
    intr = np.load(EXAMPLES / example / "intrinsics.npy")
    for requested in (81, len(poses)):
        frame_num, lat_f, video_frames = frame_plan(requested, len(poses))
        traj, k_traj = poses[:video_frames], intr[:video_frames]
        chunks = [chunk_cameras(traj, k_traj, k) for k in range(lat_f // 3)]
        assert all(p.shape == (12, 4, 4) and i.shape == (12, 4) for p, i in chunks)
        got = np.concatenate([p for p, _ in chunks])
        np.testing.assert_array_equal(got[:video_frames], traj)
        tail = got[video_frames:]
        np.testing.assert_array_equal(tail, np.broadcast_to(traj[-1], tail.shape))  # held
        np.testing.assert_array_equal(np.concatenate([i for _, i in chunks])[:video_frames], k_traj)
        # N = 12 slices pick frames 12k, 12k+4, 12k+8 (the reference's when nothing is rounded off)
        latent = np.concatenate([chunk_latent_poses(p) for p, _ in chunks])
        np.testing.assert_allclose(latent, traj[::4], atol=1e-4 * max(1.0, np.abs(traj).max()))
        if frame_num == video_frames:
            offline = offline_latent_poses(poses, requested)
            np.testing.assert_allclose(latent, offline, atol=1e-4 * np.abs(traj).max())
    with pytest.raises(ValueError):
        chunk_cameras(poses[:21], intr[:21], 2)


@pytest.mark.parametrize("n", [12, 3, 5, 4, 6, 24])
def test_chunk_latent_poses_sample_local_frames_0_4_8(n):
    poses = analytic_poses(np.arange(n) * 12 / n)
    np.testing.assert_allclose(chunk_latent_poses(poses), analytic_poses([0, 4, 8]), atol=2e-6)


def test_chunk_latent_poses_hold():
    pose = analytic_poses([7])
    np.testing.assert_array_equal(chunk_latent_poses(pose), np.repeat(pose, 3, axis=0))
    two = analytic_poses([0, 6])  # frame 8 lies beyond the last pose: held
    np.testing.assert_allclose(chunk_latent_poses(two), analytic_poses([0, 4, 6]), atol=2e-6)
    with pytest.raises(ValueError):
        chunk_latent_poses(np.zeros((3, 3, 4)))


def test_rescale_intrinsics():
    k = np.array([500.0, 400.0, 416.0, 240.0])
    got = rescale_intrinsics(k, (480, 832), (464, 832))
    np.testing.assert_allclose(got, [500, 400 * 464 / 480, 416, 232], rtol=1e-7)
    got = rescale_intrinsics(k, (480, 832), (64, 112))
    np.testing.assert_allclose(got, [500 * 112 / 832, 400 * 64 / 480, 56, 32], rtol=1e-7)
    with pytest.raises(ValueError):
        rescale_intrinsics(np.array([0.0, 1, 1, 1]), (480, 832), (64, 112))



@pytest.mark.parametrize("seed", range(6))
def test_the_numpy_slerp_of_the_client_package_is_scipys(seed):
    """Without SciPy (the client package installs none) camera interpolates in numpy: the same
    poses as SciPy's Slerp + interp1d but for float32 rounding (a few ulps)."""
    from camera.poses import _interpolate_numpy

    rng = np.random.default_rng(seed)
    poses = random_poses(9, seed=seed)
    poses[3, :3, :3] = np.diag([-1.0, -1.0, 1.0])  # a half turn: a diagonal branch of Markley's method
    positions = np.concatenate([rng.uniform(0, 8, 40), np.arange(9.0)])
    want = interpolate_poses(poses, positions)  # SciPy's, in this venv
    trans, rot = _interpolate_numpy(poses.astype(np.float64), positions)
    np.testing.assert_allclose(trans, want[:, :3, 3], rtol=0, atol=1e-7 * np.abs(want).max())  # ~2 ulps
    np.testing.assert_allclose(rot, want[:, :3, :3], rtol=0, atol=1e-6)
    flipped = poses.copy()  # quaternion signs do not matter: q and -q are one rotation
    np.testing.assert_allclose(_interpolate_numpy(flipped.astype(np.float64), positions)[1], rot, atol=1e-12)
