"""Models with random weights built directly on the device, and the benchmark's inputs.

Nothing of the released size passes through host memory: every tensor is drawn on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from camera import DEFAULT_INTRINSICS_RESOLUTION, chunk_cameras, frame_plan, output_size, translation_scale
from model.config import T5Config
from model.engines import TextEngine
from model.t5 import init_t5_random_on_device
from model.tiny import tiny_tokenizer

SOURCE_SIZE = DEFAULT_INTRINSICS_RESOLUTION  # the conditioning image's size and the intrinsics' resolution
FOCAL = 500.0  # pixels at SOURCE_SIZE
PROMPT = "A first-person walk along a sunlit street with trees, shops and parked bicycles."


def random_text_engine(cfg: T5Config, dtype: torch.dtype, device: str, seed: int, int8: bool = False) -> TextEngine:
    """A UMT5 encoder of `cfg`'s dims with random weights drawn on `device` (byte tokenizer);
    `int8`: its matrices stored as int8 (model/text_int8.py, as serve_config.gpu.yaml serves it)."""
    return TextEngine(init_t5_random_on_device(cfg, tiny_tokenizer(), dtype, device, seed, int8=int8))


@dataclass(frozen=True)
class Inputs:
    """One session's inputs: image, prompt, trajectory, output size and per-chunk cameras."""

    image: np.ndarray  # uint8 [H0, W0, 3]
    prompt: str
    poses: np.ndarray  # float64 [F, 4, 4] camera-to-world
    intrinsics: np.ndarray  # float64 [F, 4] (fx, fy, cx, cy) at SOURCE_SIZE
    frames: int
    height: int
    width: int
    latent_frames: int
    translation_scale: float

    @property
    def chunks(self) -> int:
        return self.latent_frames // 3

    def chunk_cameras(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        poses, _ = chunk_cameras(self.poses, self.intrinsics, k)
        return poses, self.intrinsics[:1]

    def context(self, text_dim: int, seed: int, tokens: int = 24) -> torch.Tensor:
        """A fixed stand-in T5 context [tokens, text_dim] (for DiT-only runs)."""
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(tokens, text_dim, generator=gen) * 0.2

    def y(self, chunk: int, lat_h: int, lat_w: int, seed: int) -> torch.Tensor:
        """A fixed stand-in conditioning y [20, 3, lat_h, lat_w] (for DiT-only runs)."""
        gen = torch.Generator().manual_seed(seed * 1000 + chunk)
        y = torch.randn(20, 3, lat_h, lat_w, generator=gen)
        y[:4] = 1.0 if chunk == 0 else 0.0  # mask channels (only the first latent frame is the image)
        y[:4, 1:] = 0.0
        return y


def make_inputs(frames: int, max_area: int, seed: int = 0) -> Inputs:
    """A smooth forward walk with a slow yaw, and a smooth random image."""
    rng = np.random.default_rng(seed)
    h0, w0 = SOURCE_SIZE
    coarse = rng.integers(0, 256, size=(h0 // 16, w0 // 16, 3)).astype(np.float32)
    image = np.kron(coarse, np.ones((16, 16, 1), dtype=np.float32)).astype(np.uint8)
    poses = np.tile(np.eye(4), (frames, 1, 1))
    for i in range(frames):
        yaw = 0.004 * i
        poses[i, :3, :3] = [[np.cos(yaw), 0, np.sin(yaw)], [0, 1, 0], [-np.sin(yaw), 0, np.cos(yaw)]]
        poses[i, :3, 3] = [0.01 * np.sin(0.1 * i), 0.0, 0.05 * i]
    intrinsics = np.tile([FOCAL, FOCAL, w0 / 2, h0 / 2], (frames, 1)).astype(np.float64)
    height, width = output_size(max_area, h0, w0)
    kept, lat_f, video_frames = frame_plan(frames, frames)
    if kept != video_frames or lat_f % 3:
        raise ValueError(f"--frames must be 12k - 3 (e.g. 81), got {frames}")
    return Inputs(image, PROMPT, poses, intrinsics, frames, height, width, lat_f,
                  translation_scale(poses, frames))
