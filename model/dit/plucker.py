"""Plücker camera embedding (spec B.5) and the streaming camera state of a session.

`CameraTrack` turns each chunk's poses into the DiT's camera tensor [1, 384, 3, h/8, w/8].
The offline reference path (`offline_plucker`: latent poses interpolated over the whole
trajectory, translations divided by the whole-trajectory maximum) runs through the same
`CameraTrack.chunk_from_latent_poses`, chunk by chunk.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from camera import (
    CHUNK_LATENT_FRAMES,
    DEFAULT_INTRINSICS_RESOLUTION,
    check_poses,
    chunk_latent_poses,
    offline_latent_poses,
    relative_poses,
    rescale_intrinsics,
    scale_translations,
    translation_scale,
)

CELL = 8  # VAE spatial stride: one latent pixel = an 8x8 cell of rays
PLUCKER_COMPONENTS = 6  # rays_o (3) + rays_d (3)
PLUCKER_CHANNELS = PLUCKER_COMPONENTS * CELL * CELL  # 384


def plucker_embedding(
    rel_poses: torch.Tensor, k: Sequence[float] | torch.Tensor, h: int, w: int
) -> torch.Tensor:
    """Plücker rays of relative poses [m, 4, 4] -> float32 [1, 384, m, h/8, w/8].

    Full pixel resolution, pixel centres (x + 0.5, y + 0.5); d = normalize((x-cx)/fx,
    (y-cy)/fy, 1); rays_d = d R^T; rays_o = t; each 8x8 cell is regrouped into channels
    c = comp*64 + i*8 + j (comp in rays_o, rays_d; (i, j) row and column in the cell).
    """
    if rel_poses.ndim != 3 or rel_poses.shape[1:] != (4, 4):
        raise ValueError(f"rel_poses must be [m, 4, 4], got {tuple(rel_poses.shape)}")
    if h % CELL or w % CELL:
        raise ValueError(f"h, w must be multiples of {CELL}, got {h}x{w}")
    rel_poses = rel_poses.to(torch.float32)
    dev = rel_poses.device
    fx, fy, cx, cy = torch.as_tensor(k, dtype=torch.float32, device=dev).unbind()
    m = rel_poses.shape[0]
    ys = torch.arange(h, dtype=torch.float32, device=dev) + 0.5
    xs = torch.arange(w, dtype=torch.float32, device=dev) + 0.5
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")  # [h, w]
    dirs = torch.stack([(grid_x - cx) / fx, (grid_y - cy) / fy, torch.ones_like(grid_x)], dim=-1)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)  # [h, w, 3]
    rays_d = torch.einsum("yxc,mdc->myxd", dirs, rel_poses[:, :3, :3])  # d R^T: [m, h, w, 3]
    rays_o = rel_poses[:, None, None, :3, 3].expand(m, h, w, 3)  # [m, h, w, 3]
    emb = torch.cat([rays_o, rays_d], dim=-1)  # [m, h, w, 6]
    emb = emb.view(m, h // CELL, CELL, w // CELL, CELL, PLUCKER_COMPONENTS)  # [m, lh, i, lw, j, c]
    emb = emb.permute(5, 2, 4, 0, 1, 3)  # [c, i, j, m, lh, lw]
    return emb.reshape(1, PLUCKER_CHANNELS, m, h // CELL, w // CELL)


class CameraTrack:
    """Camera state of one streaming session: anchor and last latent pose, chunk index.

    Relative poses continue across chunks (rel_0 = I on chunk 0, then the first latent pose of
    a chunk is taken relative to the last one of the previous chunk), computed through the
    session's first pose like the reference (`camera.relative_poses`), so chunk by
    chunk equals the reference's whole-trajectory computation. Translations are divided by
    `translation_scale` when given, else by the chunk's own largest norm (none when 0).
    """

    def __init__(
        self,
        h: int,
        w: int,
        intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION,
        translation_scale: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if h <= 0 or w <= 0 or h % CELL or w % CELL:
            raise ValueError(f"output size must be positive multiples of {CELL}, got {h}x{w}")
        if len(intrinsics_resolution) != 2 or min(intrinsics_resolution) <= 0:
            raise ValueError(f"intrinsics_resolution must be [H, W] > 0, got {intrinsics_resolution}")
        scale_ok = translation_scale is None or (math.isfinite(translation_scale) and translation_scale >= 0)
        if not scale_ok:
            raise ValueError(f"translation_scale must be finite and >= 0, got {translation_scale}")
        self.h, self.w = h, w
        self.intrinsics_resolution = (int(intrinsics_resolution[0]), int(intrinsics_resolution[1]))
        self.translation_scale = translation_scale
        self.device = torch.device(device)
        self.anchor: np.ndarray | None = None  # float32 [4, 4]: the session's first latent pose
        self.last_pose: np.ndarray | None = None  # float32 [4, 4]: the last latent pose so far
        self.chunk_index = 0

    def clone(self) -> "CameraTrack":
        """An independent track at this one's position (its poses copied)."""
        copy = CameraTrack(self.h, self.w, self.intrinsics_resolution, self.translation_scale, self.device)
        copy.anchor = None if self.anchor is None else self.anchor.copy()
        copy.last_pose = None if self.last_pose is None else self.last_pose.copy()
        copy.chunk_index = self.chunk_index
        return copy

    def chunk(self, poses: np.ndarray, intrinsics: np.ndarray) -> torch.Tensor:
        """Camera tensor [1, 384, 3, h/8, w/8] of the next chunk from its N poses [N, 4, 4]
        and intrinsics [N, 4] (only the first row is used)."""
        poses = check_poses(poses)
        intrinsics = np.asarray(intrinsics)
        if intrinsics.ndim != 2 or intrinsics.shape[1] != 4 or intrinsics.shape[0] < 1:
            raise ValueError(f"intrinsics must be [N, 4], got {intrinsics.shape}")
        return self.chunk_from_latent_poses(chunk_latent_poses(poses), intrinsics[0])

    def chunk_from_latent_poses(self, latent_poses: np.ndarray, k: np.ndarray) -> torch.Tensor:
        """Camera tensor of the next chunk from its 3 latent-frame poses and one intrinsics
        row (fx, fy, cx, cy) in `intrinsics_resolution` pixels."""
        latent_poses = check_poses(latent_poses, "latent poses")
        if latent_poses.shape[0] != CHUNK_LATENT_FRAMES:
            raise ValueError(f"need {CHUNK_LATENT_FRAMES} latent poses, got {latent_poses.shape[0]}")
        rel = relative_poses(latent_poses, self.last_pose, self.anchor)
        rel = scale_translations(rel, self.translation_scale)
        k_out = rescale_intrinsics(k, self.intrinsics_resolution, (self.h, self.w))
        rel_t = torch.from_numpy(rel).to(self.device)
        emb = plucker_embedding(rel_t, torch.from_numpy(k_out), self.h, self.w)
        if self.anchor is None:
            self.anchor = latent_poses[0].astype(np.float32)
        self.last_pose = latent_poses[-1].astype(np.float32)
        self.chunk_index += 1
        return emb


def offline_plucker(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    frame_num_requested: int,
    h: int,
    w: int,
    intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION,
) -> torch.Tensor:
    """The reference's camera tensor of a whole run -> [1, 384, lat_f, h/8, w/8].

    Latent poses from the whole trajectory, the whole-trajectory translation scale and the
    first intrinsics row, fed 3 latent poses at a time through one `CameraTrack`.
    """
    latent = offline_latent_poses(poses, frame_num_requested)
    track = CameraTrack(h, w, intrinsics_resolution, translation_scale(poses, frame_num_requested))
    k = np.asarray(intrinsics)[0]
    chunks = [
        track.chunk_from_latent_poses(latent[i : i + CHUNK_LATENT_FRAMES], k)
        for i in range(0, latent.shape[0], CHUNK_LATENT_FRAMES)
    ]
    return torch.cat(chunks, dim=2)
