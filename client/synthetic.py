"""Simple camera trajectories and a start image, for trying the server without pose files.

OpenCV camera-to-world convention (x right, y down, z forward); the first pose is the
identity, so the world frame is the first camera's frame. Intrinsics are for a 480x832 frame.
"""
from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from camera import DEFAULT_INTRINSICS_RESOLUTION
from client.trajectory import Trajectory

DEFAULT_PROMPT = ("A first-person walk through a quiet sunlit courtyard with stone paths, "
                  "green hedges and white walls, smooth steady camera motion.")
FOCAL_PX = 500.0  # ~80 degree horizontal field of view at 832 px width
KINDS = ("orbit", "dolly", "pan")


def default_intrinsics(n: int, hw: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION) -> np.ndarray:
    """float32 [n, 4] (fx, fy, cx, cy): focal 500 px, principal point at the frame centre."""
    h, w = hw
    return np.tile(np.array([FOCAL_PX, FOCAL_PX, w / 2, h / 2], dtype=np.float32), (n, 1))


def rotation_y(angle_rad: float) -> np.ndarray:
    """Rotation about the camera's y axis (down): positive angles turn the view to the right."""
    c, s = math.cos(angle_rad), math.sin(angle_rad)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _poses(rotations: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """[n, 3, 3] rotations + [n, 3] camera centres -> float32 [n, 4, 4] camera-to-world."""
    out = np.zeros((len(rotations), 4, 4))
    out[:, :3, :3] = rotations
    out[:, :3, 3] = centres
    out[:, 3, 3] = 1.0
    return out.astype(np.float32)


def orbit(frames: int, degrees: float = 60.0, radius: float = 4.0) -> np.ndarray:
    """Circle a point `radius` ahead of the first camera, always looking at it -> [frames, 4, 4]."""
    if radius <= 0:
        raise ValueError(f"orbit radius must be > 0, got {radius}")
    angles = np.radians(degrees) * np.linspace(0.0, 1.0, _count(frames))
    target = np.array([0.0, 0.0, radius])
    rot = np.stack([rotation_y(a) for a in angles])  # [n, 3, 3]
    centres = target - rot @ target  # [n, 3]: the target stays `radius` ahead on the optical axis
    return _poses(rot, centres)


def dolly(frames: int, distance: float = 2.0) -> np.ndarray:
    """Move straight ahead (negative: back) by `distance` scene units -> [frames, 4, 4]."""
    steps = np.linspace(0.0, distance, _count(frames))
    centres = np.stack([np.zeros_like(steps), np.zeros_like(steps), steps], axis=1)  # [n, 3]
    return _poses(np.repeat(np.eye(3)[None], len(steps), axis=0), centres)


def pan(frames: int, degrees: float = 45.0) -> np.ndarray:
    """Turn in place to the right (negative: left) by `degrees` -> [frames, 4, 4]."""
    angles = np.radians(degrees) * np.linspace(0.0, 1.0, _count(frames))
    return _poses(np.stack([rotation_y(a) for a in angles]), np.zeros((len(angles), 3)))


def _count(frames: int) -> int:
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return frames


def default_image(height: int = 480, width: int = 832) -> bytes:
    """PNG of a generated scene: sky gradient over a checkerboard floor in perspective."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)  # [h, w] each
    horizon = 0.45 * height
    img = np.empty((height, width, 3))
    sky = np.clip(y / horizon, 0.0, 1.0)[..., None]  # [h, w, 1]
    img[:] = (1 - sky) * np.array([70, 130, 220]) + sky * np.array([200, 225, 250])
    below = y > horizon
    depth = 40.0 / np.maximum(y - horizon, 1.0)  # floor distance of a row (pinhole, camera above the floor)
    u = (x - width / 2) * depth / 40.0
    checker = ((np.floor(u) + np.floor(depth * 4)) % 2).astype(bool)
    fog = np.clip(depth / 8, 0.0, 1.0)[..., None]
    floor = np.where(checker[..., None], [230, 210, 170], [120, 90, 60]) * (1 - fog) + fog * np.array([200, 210, 220])
    img[below] = floor[below]
    buf = io.BytesIO()
    Image.fromarray(img.round().astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def synthetic_trajectory(kind: str, frames: int, image: bytes | None = None, prompt: str = DEFAULT_PROMPT,
                         **shape: float) -> Trajectory:
    """A `Trajectory` of `kind` (orbit, dolly, pan); `shape` are that function's parameters."""
    makers = {"orbit": orbit, "dolly": dolly, "pan": pan}
    if kind not in makers:
        raise ValueError(f"trajectory kind must be one of {KINDS}, got {kind!r}")
    poses = makers[kind](frames, **shape)
    return Trajectory(image=image if image is not None else default_image(), prompt=prompt,
                      poses=poses, intrinsics=default_intrinsics(len(poses)))
