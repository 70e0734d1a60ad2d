"""A camera trajectory to play (the upstream example format) and its per-chunk session plan.

An example folder holds `image.jpg` (or .png), `prompt.txt`, `poses.npy` (float32 [N, 4, 4]
OpenCV camera-to-world) and `intrinsics.npy` (float32 [N, 4] fx, fy, cx, cy in pixels of a
480x832 frame). `plan_session` slices it into chunk requests that reproduce the offline
reference run of the same inputs (PROTOCOL.md §2): the session declares `num_frames` and
`translation_scale`, and every chunk sends the trajectory's FIRST intrinsics row, as the
reference uses only that row for the whole video.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from protocol.camera import (CHUNK_LATENT_FRAMES, DEFAULT_INTRINSICS_RESOLUTION, check_poses, chunk_cameras,
                             frame_plan, offline_latent_poses, translation_scale)
from protocol.codec import encode_infer

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


@dataclass(frozen=True)
class SessionPlan:
    """The chunk requests of one session and what they produce."""

    num_frames: int  # video frames produced (4n+1), declared to the server
    translation_scale: Optional[float]  # the reference's normaliser; None when nothing moves
    chunk_poses: tuple[np.ndarray, ...]  # per chunk: float32 [N, 4, 4] (N = 12, or 3 latent poses)
    intrinsics: np.ndarray  # float32 [4]: the first row of the trajectory, sent for every pose

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_poses)

    def chunk_frames(self, k: int) -> int:
        """Video frames of chunk k: 9 for the first, then 12."""
        return 4 * (CHUNK_LATENT_FRAMES - 1) + 1 if k == 0 else 4 * CHUNK_LATENT_FRAMES

    def messages(self, traj: Trajectory, session_id: str, *, seed: Optional[int] = None,
                 size: Optional[str] = None) -> list[bytes]:
        """The packed infer requests, in order (the first carries image, prompt and options)."""
        out = []
        for k, poses in enumerate(self.chunk_poses):
            intrinsics = np.repeat(self.intrinsics[None], len(poses), axis=0)  # [N, 4]
            first = {} if k else {
                "image": traj.image, "prompt": traj.prompt, "seed": seed, "size": size,
                "intrinsics_resolution": traj.intrinsics_resolution, "num_frames": self.num_frames,
                "translation_scale": self.translation_scale,
            }
            out.append(encode_infer(session_id, poses, intrinsics, client_chunk_id=k, **first))
        return out


def plan_session(traj: Trajectory, frames: int) -> SessionPlan:
    """Slice `traj` for `frames` requested frames as the offline reference does (spec B.1).

    When the kept frames are exactly the produced ones (4n+1 with a whole number of chunks),
    chunk k sends the slice poses[12k:12k+12]; otherwise the reference samples its latent
    poses at fractional positions, and each chunk sends its 3 latent poses (N = 3).
    """
    kept, lat_f, video_frames = frame_plan(frames, traj.poses.shape[0])
    n_chunks = lat_f // CHUNK_LATENT_FRAMES
    if kept == video_frames:
        chunks = tuple(chunk_cameras(traj.poses[:kept], traj.intrinsics[:kept], k)[0] for k in range(n_chunks))
    else:
        latent = offline_latent_poses(traj.poses, frames)  # [lat_f, 4, 4]
        chunks = tuple(latent[CHUNK_LATENT_FRAMES * k: CHUNK_LATENT_FRAMES * (k + 1)] for k in range(n_chunks))
    # A still camera has scale 0: the reference then leaves translations unscaled, and so does
    # the server for a session without `translation_scale` (a chunk's own max norm is 0 too).
    scale = translation_scale(traj.poses, frames)
    return SessionPlan(num_frames=video_frames, translation_scale=scale or None,
                       chunk_poses=chunks, intrinsics=traj.intrinsics[0].astype(np.float32))
