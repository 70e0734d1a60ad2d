"""Trajectory loading and the per-chunk session plan (the slicing that reproduces the offline run)."""
from __future__ import annotations

import numpy as np
import pytest

from camera import chunk_video_frames, offline_latent_poses, translation_scale
from client.trajectory import Trajectory, plan_session
from protocol.codec import decode
from support import EXAMPLES


@pytest.fixture(scope="module")
def ex01() -> Trajectory:
    return Trajectory.load([EXAMPLES / "01"])  # intrinsics vary over its frames


def test_load_folder_and_files_agree(ex01):
    folder = EXAMPLES / "01"
    files = Trajectory.load([folder / "poses.npy", folder / "image.jpg", folder / "intrinsics.npy",
                             folder / "prompt.txt"])
    assert files.image == ex01.image == (folder / "image.jpg").read_bytes()
    assert files.prompt == ex01.prompt == (folder / "prompt.txt").read_text(encoding="utf-8")
    np.testing.assert_array_equal(files.poses, np.load(folder / "poses.npy"))
    np.testing.assert_array_equal(files.intrinsics, np.load(folder / "intrinsics.npy"))
    assert Trajectory.load([folder], prompt="other").prompt == "other"


def test_load_names_what_is_missing(tmp_path):
    (tmp_path / "poses.npy").write_bytes(b"")
    with pytest.raises(ValueError, match="image, intrinsics.npy, prompt.txt"):
        Trajectory.load([tmp_path])


def test_save_then_load_round_trips(ex01, tmp_path):
    back = Trajectory.load([ex01.save(tmp_path / "t")])
    assert back.image == ex01.image and back.prompt == ex01.prompt
    np.testing.assert_array_equal(back.poses, ex01.poses)
    np.testing.assert_array_equal(back.intrinsics, ex01.intrinsics)


def test_plan_slices_twelve_poses_per_chunk(ex01):
    plan = plan_session(ex01, 33)
    assert (plan.num_frames, plan.num_chunks) == (33, 3)
    assert [chunk_video_frames(k) for k in range(plan.num_chunks)] == [9, 12, 12]
    for k, poses in enumerate(plan.chunk_poses):
        expected = ex01.poses[np.minimum(np.arange(12 * k, 12 * k + 12), 32)]  # the 4n+1 end holds the last pose
        np.testing.assert_array_equal(poses, expected)
    assert plan.translation_scale == translation_scale(ex01.poses, 33)


def test_plan_sends_latent_poses_when_frames_are_not_whole_chunks(ex01):
    plan = plan_session(ex01, 41)  # 11 latent frames -> 9 (3 chunks); poses sampled at linspace(0, 40, 9)
    assert (plan.num_frames, plan.num_chunks) == (33, 3)
    latent = offline_latent_poses(ex01.poses, 41)
    np.testing.assert_array_equal(np.concatenate(plan.chunk_poses), latent)
    assert plan.translation_scale == translation_scale(ex01.poses, 41)


def test_frames_are_capped_by_the_trajectory(ex01):
    short = Trajectory(ex01.image, ex01.prompt, ex01.poses[:30], ex01.intrinsics[:30])
    plan = plan_session(short, 81)  # 30 poses -> 29 frames -> 8 latent -> 6 (2 chunks)
    assert (plan.num_frames, plan.num_chunks) == (21, 2)


def test_messages_carry_session_options_once_and_the_first_intrinsics_row(ex01):
    assert not np.array_equal(ex01.intrinsics[0], ex01.intrinsics[20])
    plan = plan_session(ex01, 33)
    reqs = [decode(m) for m in ex01.messages(plan, "sid", seed=7, size="32*64")]
    first = reqs[0]
    assert (first.image, first.prompt, first.seed, first.size, first.num_frames) == (ex01.image, ex01.prompt, 7,
                                                                                     "32*64", 33)
    assert first.translation_scale == pytest.approx(plan.translation_scale)
    assert first.intrinsics_resolution == (480, 832)
    for k, req in enumerate(reqs):
        assert req.session_id == "sid" and req.client_chunk_id == k
        np.testing.assert_array_equal(req.cameras.intrinsics, np.repeat(ex01.intrinsics[:1], 12, axis=0))
    assert all(r.image is None and r.prompt is None and r.num_frames is None for r in reqs[1:])


def test_trajectory_checks_its_inputs(ex01):
    with pytest.raises(ValueError, match="one row per pose"):
        Trajectory(ex01.image, "p", ex01.poses[:10], ex01.intrinsics[:9])
    with pytest.raises(ValueError, match="PNG or JPEG"):
        Trajectory(b"GIF89a....", "p", ex01.poses[:10], ex01.intrinsics[:10])
