"""Held keys -> camera poses: the server-side integration of `control` (PROTOCOL.md, `control`).

Poses are OpenCV camera-to-world (x right, y down, z forward) in the session's world frame
(the first camera's, for a session driven by keys from its start). A pose is written

    P = [R | t],   R = Ry(yaw) @ Rx(pitch) @ Rz(roll)

with Ry(a) = [[ca, 0, sa], [0, 1, 0], [-sa, 0, ca]], Rx(a) = [[1, 0, 0], [0, ca, -sa], [0, sa, ca]],
Rz(a) = [[ca, -sa, 0], [sa, ca, 0], [0, 0, 1]]: yaw > 0 turns right, pitch > 0 looks up; roll
is kept as it is (0 for a session driven by keys alone; an explicit pose may bring one).

Keys give five axes, each -1, 0 or +1 (a key and its opposite cancel):

    m = W - S (forward),  s = D - A (right),  u = Q - E (up),
    y = L - J (turn right; ArrowRight / ArrowLeft too),  p = I - K (look up; ArrowUp / ArrowDown too)

and one video frame advances the pose by (`KeySteps`; the heading-plane move of the web page):

    t     += move * m * (sin yaw, 0, cos yaw) + lateral * (s * (cos yaw, 0, -sin yaw) + u * (0, -1, 0))
    yaw   += yaw_deg * y                    (in radians)
    pitch  = clip(pitch + pitch_deg * p, -L, L),  L = max(pitch_limit_deg, |pitch|)

(the translation uses the heading before the turn; L never pulls back a pose already beyond
the limit, it only stops it going further). A chunk covers 12 video frames: the session's
first chunk starts at its start pose (frame 0 = the image's camera) and takes 11 steps; a
later chunk takes 12 steps from the previous chunk's last pose.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from camera.frames import CHUNK_VIDEO_FRAMES

# name (lower case) -> (axis, sign). The names are those of the browser's `KeyboardEvent.key`,
# lower-cased (`w`, `ArrowUp` -> `arrowup`).
KEY_AXES: dict[str, tuple[str, int]] = {
    "w": ("move", 1), "s": ("move", -1),
    "d": ("lateral", 1), "a": ("lateral", -1),
    "q": ("vertical", 1), "e": ("vertical", -1),
    "l": ("yaw", 1), "arrowright": ("yaw", 1), "j": ("yaw", -1), "arrowleft": ("yaw", -1),
    "i": ("pitch", 1), "arrowup": ("pitch", 1), "k": ("pitch", -1), "arrowdown": ("pitch", -1),
}
KEY_NAMES: tuple[str, ...] = tuple(KEY_AXES)
AXES = ("move", "lateral", "vertical", "yaw", "pitch")


@dataclass(frozen=True, slots=True)
class KeySteps:
    """Per video frame steps of a held key. The defaults are the LingBot-World keyboard
    convention as TeleFuser's `pipelines/lingbot_world_fast/service.py` applies it (4 steps per
    latent frame of move 0.05, lateral 0.05, yaw 2 deg, pitch 2 deg, pitch limit 85 deg; its
    docs say this matches the LingBot source's trajectory convention)."""

    move: float = 0.05  # scene units per frame, W/S
    lateral: float = 0.05  # scene units per frame, A/D and Q/E
    yaw_deg: float = 2.0  # J/L
    pitch_deg: float = 2.0  # I/K
    pitch_limit_deg: float = 85.0  # |pitch| the keys never exceed


def key_axes(keys: Iterable[str]) -> dict[str, int]:
    """The five axes (-1, 0, +1) of a set of held keys; ValueError naming an unknown key."""
    plus: set[str] = set()
    minus: set[str] = set()
    for key in keys:
        hit = KEY_AXES.get(key)
        if hit is None:
            raise ValueError(f"unknown key {key!r}: the keys are {', '.join(KEY_NAMES)}")
        (plus if hit[1] > 0 else minus).add(hit[0])
    return {axis: (axis in plus) - (axis in minus) for axis in AXES}


def decompose(pose: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """A camera-to-world pose [4, 4] -> (t [3] float64, yaw, pitch, roll) with R = Ry Rx Rz."""
    p = np.asarray(pose, dtype=np.float64)
    r = p[:3, :3]
    pitch = math.asin(max(-1.0, min(1.0, -r[1, 2])))
    yaw = math.atan2(r[0, 2], r[2, 2])
    roll = math.atan2(r[1, 0], r[1, 1])
    return p[:3, 3].copy(), yaw, pitch, roll


def compose(t: np.ndarray, yaw: float, pitch: float, roll: float = 0.0) -> np.ndarray:
    """(t, yaw, pitch, roll) -> float64 [4, 4] camera-to-world, R = Ry(yaw) Rx(pitch) Rz(roll)."""
    cy, sy, cp, sp, cr, sr = (math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch),
                              math.cos(roll), math.sin(roll))
    ry = np.array([[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]])
    rx = np.array([[1.0, 0.0, 0.0], [0.0, cp, -sp], [0.0, sp, cp]])
    rz = np.array([[cr, -sr, 0.0], [sr, cr, 0.0], [0.0, 0.0, 1.0]])
    out = np.eye(4)
    out[:3, :3] = ry @ rx @ rz
    out[:3, 3] = t
    return out


def integrate_keys(start: np.ndarray, keys: Iterable[str], steps: KeySteps, frames: int,
                   include_start: bool = False) -> np.ndarray:
    """`frames` poses (float64 [frames, 4, 4]) from `start` [4, 4] with `keys` held, one step a
    frame (module docstring). `include_start`: the first pose is `start` itself (a session's
    first chunk); otherwise it is one step on."""
    axes = key_axes(keys)
    t, yaw, pitch, roll = decompose(start)
    d_yaw, d_pitch = math.radians(steps.yaw_deg) * axes["yaw"], math.radians(steps.pitch_deg) * axes["pitch"]
    limit = math.radians(steps.pitch_limit_deg)
    out = np.empty((frames, 4, 4))
    for i in range(frames):
        if i > 0 or not include_start:
            forward = np.array([math.sin(yaw), 0.0, math.cos(yaw)])
            right = np.array([math.cos(yaw), 0.0, -math.sin(yaw)])
            t = t + steps.move * axes["move"] * forward + steps.lateral * (
                axes["lateral"] * right + axes["vertical"] * np.array([0.0, -1.0, 0.0]))
            yaw += d_yaw
            pitch = min(max(pitch + d_pitch, min(-limit, pitch)), max(limit, pitch))
        out[i] = compose(t, yaw, pitch, roll)
    if not axes["yaw"] and not axes["pitch"]:
        out[:, :3, :3] = np.asarray(start, dtype=np.float64)[:3, :3]  # no turn: the start's rotation exactly
    return out


def key_chunk_poses(last: np.ndarray | None, keys: Iterable[str], steps: KeySteps,
                    frames: int = CHUNK_VIDEO_FRAMES) -> np.ndarray:
    """The poses (float64 [12, 4, 4]) of a chunk driven by `keys`: from the identity for the
    session's first chunk (`last` None), else continuing from the previous chunk's last pose."""
    if last is None:
        return integrate_keys(np.eye(4), keys, steps, frames, include_start=True)
    return integrate_keys(last, keys, steps, frames)


def default_intrinsics_row(hw: tuple[int, int]) -> np.ndarray:
    """(fx, fy, cx, cy) float32 for a frame of [H, W] pixels with no intrinsics sent: focal 500 px
    at 832 wide (about 80 degrees across, as the web page and the synthetic trajectories), the
    principal point at the centre."""
    h, w = hw
    f = 500.0 * w / 832.0
    return np.array([f, f, w / 2.0, h / 2.0], dtype=np.float32)
