"""model/dit/plucker.py: Plücker embedding, the offline path and the streaming CameraTrack."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from camera import (
    chunk_cameras,
    frame_plan,
    offline_latent_poses,
    translation_scale,
)
from model.dit.plucker import CameraTrack, offline_plucker, plucker_embedding
from support import EXAMPLES, GOLDEN_FILES, load_golden, rel_err

TOL = 1e-5
GOLDEN_NAMES = [p.name for p in GOLDEN_FILES]
H, W = 16, 24
K = (20.0, 18.0, 11.0, 9.0)  # fx, fy, cx, cy


def golden_inputs(name: str):
    g = load_golden(name)
    m = g["meta"]
    ex = EXAMPLES / m["example"]
    return g, m, np.load(ex / "poses.npy"), np.load(ex / "intrinsics.npy")


def pixel_ray(x: int, y: int) -> np.ndarray:
    """Unit camera-frame ray through the centre of pixel (x, y), in float64."""
    fx, fy, cx, cy = K
    d = np.array([(x + 0.5 - cx) / fx, (y + 0.5 - cy) / fy, 1.0])
    return d / np.linalg.norm(d)


def at_pixel(emb: torch.Tensor, frame: int, x: int, y: int) -> np.ndarray:
    """The 6 Plücker components of full-resolution pixel (x, y): channel c*64 + i*8 + j."""
    i, j = y % 8, x % 8
    chans = [c * 64 + i * 8 + j for c in range(6)]
    return emb[0, chans, frame, y // 8, x // 8].double().numpy()


def pose(rotvec=(0, 0, 0), t=(0, 0, 0)) -> np.ndarray:
    p = np.eye(4, dtype=np.float32)
    p[:3, :3] = Rotation.from_rotvec(rotvec).as_matrix()
    p[:3, 3] = t
    return p


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_offline_plucker_matches_golden(name):
    g, m, poses, intr = golden_inputs(name)
    got = offline_plucker(poses, intr, m["frame_num"], m["height"], m["width"])
    want = torch.cat([c["plucker"] for c in g["chunks"]], dim=2)
    assert got.shape == want.shape == (1, 384, m["lat_f"], m["lat_h"], m["lat_w"])
    assert rel_err(got, want) <= TOL


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_streaming_track_with_latent_poses_matches_golden(name):
    """Three latent poses per chunk over the wire (N = 3) + the whole-trajectory scale."""
    g, m, poses, intr = golden_inputs(name)
    latent = offline_latent_poses(poses, m["frame_num"])
    track = CameraTrack(m["height"], m["width"], (480, 832), translation_scale(poses, m["frame_num"]))
    for c, chunk in enumerate(g["chunks"]):
        got = track.chunk(latent[3 * c : 3 * c + 3], np.repeat(intr[:1], 3, axis=0))
        assert rel_err(got, chunk["plucker"]) <= TOL
        assert track.chunk_index == c + 1
        np.testing.assert_array_equal(track.last_pose, latent[3 * c + 2])
        np.testing.assert_array_equal(track.anchor, latent[0])


def test_streaming_track_with_trajectory_slices_matches_golden():
    """tiny_00: frame_num 21 = 12k - 3, so the N = 12 slices poses[12k:12k+12] are exact."""
    g, m, poses, intr = golden_inputs("tiny_00.pt")
    _, _, video_frames = frame_plan(m["frame_num"], len(poses))
    track = CameraTrack(m["height"], m["width"], translation_scale=translation_scale(poses, m["frame_num"]))
    for c, chunk in enumerate(g["chunks"]):
        p, k = chunk_cameras(poses[:video_frames], intr[:video_frames], c)
        assert rel_err(track.chunk(p, k), chunk["plucker"]) <= TOL


def test_track_without_scale_normalises_each_chunk():
    # z(f) = 0.3 f + 0.01 f^2 while turning about y: relative steps between latent frames
    # (every 4 frames) have lengths |z(f) - z(f-4)|; chunk 1 starts from chunk 0's frame 8
    poses = np.stack([pose((0, 0.01 * f, 0), (0.0, 0.0, 0.3 * f + 0.01 * f * f)) for f in range(24)])
    track = CameraTrack(H, W, intrinsics_resolution=(H, W))
    want = [np.array([0.0, 1.36, 1.68]) / 1.68, np.array([2.0, 2.32, 2.64]) / 2.64]
    for c in range(2):
        emb = track.chunk(*chunk_cameras(poses, np.tile(K, (24, 1)), c))
        origins = emb[0, :192].reshape(3, 64, 3, H // 8, W // 8)  # [comp, cell, frame, lh, lw]
        assert (origins == origins[:, :1, :, :1, :1]).all()  # one origin per frame
        np.testing.assert_allclose(origins[:, 0, :, 0, 0].norm(dim=0).numpy(), want[c], rtol=1e-5)


def test_plucker_identity_pose():
    emb = plucker_embedding(torch.from_numpy(pose()[None]), K, H, W)
    assert emb.shape == (1, 384, 1, H // 8, W // 8) and emb.dtype == torch.float32
    assert emb[0, :192].abs().max().item() == 0.0  # origins
    for x, y in [(0, 0), (13, 5), (W - 1, H - 1)]:
        np.testing.assert_allclose(at_pixel(emb, 0, x, y)[3:], pixel_ray(x, y), atol=1e-6)


def test_plucker_pure_translation_and_pure_rotation():
    t = (0.5, -2.0, 3.0)
    rv = (0.3, -0.2, 0.9)
    rel = torch.from_numpy(np.stack([pose(t=t), pose(rotvec=rv)]))
    emb = plucker_embedding(rel, K, H, W)
    rot = Rotation.from_rotvec(rv).as_matrix()
    for x, y in [(1, 2), (9, 14), (23, 7)]:
        np.testing.assert_allclose(at_pixel(emb, 0, x, y), np.r_[t, pixel_ray(x, y)], atol=1e-6)
        np.testing.assert_allclose(at_pixel(emb, 1, x, y), np.r_[0, 0, 0, rot @ pixel_ray(x, y)], atol=1e-6)


def test_plucker_channel_layout_on_a_hand_computed_pixel():
    # pixel x = 8*2 + 5, y = 8*1 + 3 -> latent (1, 2), cell row i = 3, column j = 5
    x, y = 21, 11
    rel = torch.from_numpy(pose(rotvec=(0, 0, np.pi / 2), t=(1.0, 2.0, 3.0))[None])
    emb = plucker_embedding(rel, K, H, W)
    fx, fy, cx, cy = K
    dx, dy = (x + 0.5 - cx) / fx, (y + 0.5 - cy) / fy  # 0.525, 0.1388..
    n = np.sqrt(dx * dx + dy * dy + 1)
    # rotation by 90 deg about z: (dx, dy, 1) -> (-dy, dx, 1)
    want = [1.0, 2.0, 3.0, -dy / n, dx / n, 1 / n]
    for comp, v in enumerate(want):
        assert emb[0, comp * 64 + 3 * 8 + 5, 0, 1, 2].item() == pytest.approx(v, abs=1e-6)


def test_bad_inputs():
    with pytest.raises(ValueError):
        plucker_embedding(torch.zeros(2, 3, 4), K, H, W)
    with pytest.raises(ValueError):
        CameraTrack(60, 112)
    track = CameraTrack(H, W)
    with pytest.raises(ValueError):
        track.chunk(np.zeros((3, 4, 4), dtype=np.float32) + np.nan, np.tile(K, (3, 1)))
    with pytest.raises(ValueError):
        track.chunk(np.stack([pose()] * 3), np.zeros((3, 3)))
    with pytest.raises(ValueError):
        track.chunk_from_latent_poses(np.stack([pose()] * 2), np.array(K))
    assert track.chunk_index == 0 and track.last_pose is None
