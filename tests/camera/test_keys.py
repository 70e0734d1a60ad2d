"""camera/keys.py: held keys -> a chunk's poses, against the formula its docstring documents
(recomputed here independently: scipy's intrinsic YXZ Euler angles for R = Ry Rx Rz)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from camera.keys import KEY_NAMES, KeySteps, compose, decompose, integrate_keys, key_axes, key_chunk_poses

STEPS = KeySteps()


def formula(keys: set[str], yaw: float, pitch: float, t: np.ndarray, frames: int, first: bool,
            steps: KeySteps = STEPS, roll: float = 0.0) -> np.ndarray:
    """The documented per-frame update, written out with the key names (not the module's table)."""
    m = ("w" in keys) - ("s" in keys)
    s = ("d" in keys) - ("a" in keys)
    u = ("q" in keys) - ("e" in keys)
    y = bool(keys & {"l", "arrowright"}) - bool(keys & {"j", "arrowleft"})
    p = bool(keys & {"i", "arrowup"}) - bool(keys & {"k", "arrowdown"})
    out = []
    for i in range(frames):
        if i > 0 or not first:
            t = t + steps.move * m * np.array([math.sin(yaw), 0, math.cos(yaw)]) + steps.lateral * (
                s * np.array([math.cos(yaw), 0, -math.sin(yaw)]) + u * np.array([0, -1, 0]))
            yaw += math.radians(steps.yaw_deg) * y
            lim = max(math.radians(steps.pitch_limit_deg), abs(pitch))
            pitch = float(np.clip(pitch + math.radians(steps.pitch_deg) * p, -lim, lim))
        pose = np.eye(4)
        pose[:3, :3] = Rotation.from_euler("YXZ", [yaw, pitch, roll]).as_matrix()
        pose[:3, 3] = t
        out.append(pose)
    return np.stack(out)


@pytest.mark.parametrize("keys", [set(), {"w"}, {"s", "a"}, {"d", "q"}, {"e", "j"}, {"l", "i"},
                                  {"arrowleft", "arrowdown", "w"}, {"w", "s", "l", "j"}, {"w", "d", "q", "l", "i"}])
def test_chunks_follow_the_documented_formula(keys):
    first = key_chunk_poses(None, keys, STEPS)
    np.testing.assert_allclose(first, formula(keys, 0.0, 0.0, np.zeros(3), 12, first=True), atol=1e-12)
    # a later chunk continues 12 steps from the first one's last pose
    second = key_chunk_poses(first[-1], keys, STEPS)
    both = formula(keys, 0.0, 0.0, np.zeros(3), 24, first=True)
    np.testing.assert_allclose(second, both[12:], atol=1e-9)


def test_hand_computed_values():
    w = key_chunk_poses(None, {"w"}, STEPS)
    np.testing.assert_array_equal(w[:, :3, :3], np.broadcast_to(np.eye(3), (12, 3, 3)))
    np.testing.assert_allclose(w[:, 2, 3], 0.05 * np.arange(12))  # straight ahead along +z
    q = key_chunk_poses(None, {"q"}, STEPS)
    np.testing.assert_allclose(q[-1, :3, 3], [0, -0.55, 0])  # up is -y (OpenCV)
    turn = key_chunk_poses(None, {"l"}, STEPS)
    forward = turn[-1, :3, :3] @ [0, 0, 1]  # after 11 steps of 2 degrees, looking right of +z
    np.testing.assert_allclose(forward, [math.sin(math.radians(22)), 0, math.cos(math.radians(22))], atol=1e-12)
    look = key_chunk_poses(None, {"i"}, STEPS)
    assert (look[-1, :3, :3] @ [0, 0, 1])[1] < 0  # looking up: the view direction points to -y


def test_pitch_stops_at_the_limit_and_never_jumps_back():
    pose = np.eye(4)
    for _ in range(5):  # 60 frames of 2 degrees: past 85
        pose = key_chunk_poses(pose, {"i"}, STEPS)[-1]
    assert decompose(pose)[2] == pytest.approx(math.radians(85))
    steep = compose(np.zeros(3), 0.3, math.radians(89), 0.0)  # an explicit pose beyond the limit
    held = key_chunk_poses(steep, {"i", "w"}, STEPS)
    np.testing.assert_allclose([decompose(p)[2] for p in held], math.radians(89), atol=1e-12)
    down = key_chunk_poses(steep, {"k"}, STEPS)
    np.testing.assert_allclose(decompose(down[0])[2], math.radians(87), atol=1e-12)


def test_continues_from_an_explicit_pose_with_roll():
    start = compose(np.array([1.0, 2.0, 3.0]), 0.4, -0.2, 0.1)
    np.testing.assert_allclose(start[:3, :3], Rotation.from_euler("YXZ", [0.4, -0.2, 0.1]).as_matrix(), atol=1e-15)
    t, yaw, pitch, roll = decompose(start)
    np.testing.assert_allclose([yaw, pitch, roll], [0.4, -0.2, 0.1], atol=1e-12)
    got = integrate_keys(start, {"w", "j", "k"}, STEPS, 12)
    np.testing.assert_allclose(got, formula({"w", "j", "k"}, 0.4, -0.2, t, 12, first=False, roll=0.1), atol=1e-12)
    still = integrate_keys(start, set(), STEPS, 12)
    np.testing.assert_array_equal(still, np.broadcast_to(start, (12, 4, 4)))  # nothing held: the pose as it was


def test_steps_come_from_the_settings():
    steps = KeySteps(move=0.2, lateral=0.1, yaw_deg=5.0, pitch_deg=1.0, pitch_limit_deg=10.0)
    got = key_chunk_poses(None, {"w", "a", "l", "i"}, steps)
    np.testing.assert_allclose(got, formula({"w", "a", "l", "i"}, 0.0, 0.0, np.zeros(3), 12, True, steps), atol=1e-12)


def test_unknown_keys_are_refused_and_names_are_complete():
    with pytest.raises(ValueError, match="unknown key 'x'"):
        key_axes(["w", "x"])
    assert set(KEY_NAMES) == set("wasdqeijkl") | {"arrowup", "arrowdown", "arrowleft", "arrowright"}
    assert key_axes(["i", "arrowup", "k"])["pitch"] == 0
