"""A camera trajectory to play (the upstream example format) and its session's requests.

An example folder holds `image.jpg` (or .png), `prompt.txt`, `poses.npy` (float32 [N, 4, 4]
OpenCV camera-to-world) and `intrinsics.npy` (float32 [N, 4] fx, fy, cx, cy in pixels of a
480x832 frame). `plan_session` slices it with `camera.plan_session` into chunk payloads that
reproduce the offline reference run of the same inputs (PROTOCOL.md §2), and
`Trajectory.messages` packs them (`protocol.requests.plan_requests`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

import camera
from camera import DEFAULT_INTRINSICS_RESOLUTION, SessionPlan, check_poses
from protocol.codec import encode
from protocol.requests import SessionStart, plan_requests

IMAGE_NAMES = ("image.jpg", "image.jpeg", "image.png")
IMAGE_SUFFIXES = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}


@dataclass(frozen=True)
class Trajectory:
    """Inputs of one session: start image, prompt, camera poses and intrinsics."""

    image: bytes  # PNG or JPEG file bytes
    prompt: str
    poses: np.ndarray  # float32 [N, 4, 4] OpenCV camera-to-world
    intrinsics: np.ndarray  # float32 [N, 4] (fx, fy, cx, cy) in pixels of intrinsics_resolution
    intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION

    def __post_init__(self) -> None:
        poses = check_poses(self.poses)
        if self.intrinsics.shape != (poses.shape[0], 4):
            raise ValueError(f"intrinsics must be [N, 4] with N = {poses.shape[0]} (one row per pose), "
                             f"got {self.intrinsics.shape}")
        if self.image[:8] != b"\x89PNG\r\n\x1a\n" and self.image[:3] != b"\xff\xd8\xff":
            raise ValueError("the image must be a PNG or JPEG file")

    @classmethod
    def load(cls, paths: Sequence[str | Path], prompt: Optional[str] = None) -> Trajectory:
        """From an example folder, or from its files given one by one (any order).

        `prompt` overrides prompt.txt (which is then optional).
        """
        files = _resolve(paths)
        missing = [name for name in ("image", "poses.npy", "intrinsics.npy") if name not in files]
        if prompt is None and "prompt.txt" not in files:
            missing.append("prompt.txt")
        if missing:
            raise ValueError(f"missing {', '.join(missing)}: give an example folder or the files "
                             "image.jpg|png, prompt.txt, poses.npy, intrinsics.npy")
        return cls(
            image=files["image"].read_bytes(),
            prompt=prompt if prompt is not None else files["prompt.txt"].read_text(encoding="utf-8"),
            poses=np.load(files["poses.npy"]).astype(np.float32),
            intrinsics=np.load(files["intrinsics.npy"]).astype(np.float32),
        )

    def messages(self, plan: SessionPlan, session_id: str, *, seed: Optional[int] = None,
                 size: Optional[str] = None, prompt_schedule: Optional[dict[int, str]] = None,
                 open_ended: bool = False, prefix_cache: Optional[bool] = None) -> list[bytes]:
        """The packed infer requests of `plan` for this trajectory, in order (the first carries
        image, prompt and the session options; `prompt_schedule` {chunk: prompt} steers;
        `open_ended` declares no num_frames; `prefix_cache=False` keeps the session out of the
        server's prefix store)."""
        start = SessionStart(self.image, self.prompt, seed=seed, size=size,
                             intrinsics_resolution=self.intrinsics_resolution, prefix_cache=prefix_cache)
        return [encode(r) for r in plan_requests(plan, session_id, start, prompt_schedule=prompt_schedule,
                                                 open_ended=open_ended)]

    def save(self, folder: str | Path) -> Path:
        """Write the example format (image.png|jpg, prompt.txt, poses.npy, intrinsics.npy)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        suffix = ".png" if self.image[:4] == b"\x89PNG" else ".jpg"
        (folder / f"image{suffix}").write_bytes(self.image)
        (folder / "prompt.txt").write_text(self.prompt, encoding="utf-8")
        np.save(folder / "poses.npy", self.poses.astype(np.float32))
        np.save(folder / "intrinsics.npy", self.intrinsics.astype(np.float32))
        return folder


def _resolve(paths: Sequence[str | Path]) -> dict[str, Path]:
    """Map file roles (image, prompt.txt, poses.npy, intrinsics.npy) to paths."""
    files: dict[str, Path] = {}
    for p in map(Path, paths):
        if p.is_dir():
            images = [p / n for n in IMAGE_NAMES if (p / n).is_file()]
            if images:
                files["image"] = images[0]
            for name in ("prompt.txt", "poses.npy", "intrinsics.npy"):
                if (p / name).is_file():
                    files[name] = p / name
        elif not p.is_file():
            raise ValueError(f"{p} does not exist")
        elif p.suffix.lower() in IMAGE_SUFFIXES:
            files["image"] = p
        elif p.name in ("prompt.txt", "poses.npy", "intrinsics.npy"):
            files[p.name] = p
        elif p.suffix == ".txt":
            files["prompt.txt"] = p
        else:
            raise ValueError(f"{p}: expected image.jpg|png, prompt.txt, poses.npy or intrinsics.npy")
    return files


def plan_session(traj: Trajectory, frames: int) -> SessionPlan:
    """`traj` sliced for `frames` requested frames as the offline reference does
    (`camera.plan_session`)."""
    return camera.plan_session(traj.poses, traj.intrinsics, frames)
