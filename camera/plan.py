"""The chunk plan of a session whose whole trajectory is known (PROTOCOL.md §2, spec B.1, H.3).

`plan_session` slices a trajectory into per-chunk camera payloads that reproduce the offline
reference run of the same inputs: the session declares `num_frames` and `translation_scale`,
and every chunk sends the trajectory's FIRST intrinsics row (the reference uses only that row
for the whole video). The CLI, the Python client and the server's offline endpoint
(`POST /v1/videos`) all plan with it; `protocol.requests.plan_requests` builds the requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from camera.frames import CHUNK_LATENT_FRAMES, frame_plan
from camera.poses import check_poses, chunk_cameras, offline_latent_poses, translation_scale


@dataclass(frozen=True)
class SessionPlan:
    """The camera payloads of one session's chunks and what they produce."""

    num_frames: int  # video frames produced (4n+1), declared to the server
    translation_scale: Optional[float]  # the reference's normaliser; None when nothing moves
    chunk_poses: tuple[np.ndarray, ...]  # per chunk: float32 [N, 4, 4] (N = 12, or 3 latent poses)
    intrinsics: np.ndarray  # float32 [4]: the first row of the trajectory, sent for every pose

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_poses)

    def chunk_intrinsics(self, k: int) -> np.ndarray:
        """float32 [N, 4]: the plan's intrinsics row once per pose of chunk k."""
        return np.repeat(self.intrinsics[None], len(self.chunk_poses[k]), axis=0)


def plan_session(poses: np.ndarray, intrinsics: np.ndarray, frames: int) -> SessionPlan:
    """Slice a trajectory (poses [N, 4, 4], intrinsics [N, 4]) for `frames` requested frames as
    the offline reference does (spec B.1).

    When the kept frames are exactly the produced ones (4n+1 with a whole number of chunks),
    chunk k sends the slice poses[12k:12k+12]; otherwise the reference samples its latent
    poses at fractional positions, and each chunk sends its 3 latent poses (N = 3).
    """
    poses = check_poses(poses)
    intrinsics = np.asarray(intrinsics)
    if intrinsics.shape != (poses.shape[0], 4):
        raise ValueError(f"intrinsics must be [N, 4] with N = {poses.shape[0]} (one row per pose), "
                         f"got {intrinsics.shape}")
    kept, lat_f, video_frames = frame_plan(frames, poses.shape[0])
    n_chunks = lat_f // CHUNK_LATENT_FRAMES
    if kept == video_frames:
        chunks = tuple(chunk_cameras(poses[:kept], intrinsics[:kept], k)[0] for k in range(n_chunks))
    else:
        latent = offline_latent_poses(poses, frames)  # [lat_f, 4, 4]
        chunks = tuple(latent[CHUNK_LATENT_FRAMES * k: CHUNK_LATENT_FRAMES * (k + 1)] for k in range(n_chunks))
    # A still camera has scale 0: the reference then leaves translations unscaled, and so does
    # the server for a session without `translation_scale` (a chunk's own max norm is 0 too).
    scale = translation_scale(poses, frames)
    return SessionPlan(num_frames=video_frames, translation_scale=scale or None,
                       chunk_poses=chunks, intrinsics=intrinsics[0].astype(np.float32))
