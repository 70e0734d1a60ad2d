"""Chunk geometry and the frame plan of a session (spec B.1; PROTOCOL.md §2, §4).

One source for the numbers every package shares: a chunk is 3 latent frames; the VAE's
temporal stride is 4, so chunk 0 decodes to 9 video frames and every later chunk to 12;
intrinsics are expressed in 480x832 pixels unless a session says otherwise; a session has at
most 1024 latent frame positions (the released model's RoPE table), which caps its chunks
and its declared `num_frames`.
"""
from __future__ import annotations

import math

CHUNK_LATENT_FRAMES = 3  # latent frames per chunk (the reference's chunk_size)
VAE_TIME_STRIDE = 4  # video frames per latent frame (after the first)
CHUNK_VIDEO_FRAMES = VAE_TIME_STRIDE * CHUNK_LATENT_FRAMES  # 12
FIRST_CHUNK_VIDEO_FRAMES = 1 + VAE_TIME_STRIDE * (CHUNK_LATENT_FRAMES - 1)  # 9
FPS = 16  # the released model's video frame rate
DEFAULT_INTRINSICS_RESOLUTION = (480, 832)  # [H, W] the reference's intrinsics are given in
DEFAULT_SIZE = "480*832"  # max output area of the reference (MAX_AREA_CONFIGS)
MAX_LATENT_FRAMES = 1024  # latent frame positions of one session (the reference's RoPE table)
MAX_CHUNKS = (MAX_LATENT_FRAMES - 1) // CHUNK_LATENT_FRAMES  # 341 chunks = 1023 latent frames
MAX_NUM_FRAMES = VAE_TIME_STRIDE * CHUNK_LATENT_FRAMES * MAX_CHUNKS + 1  # 4093: plans MAX_CHUNKS chunks


def parse_size(size: str) -> int:
    """Max area of a size string such as "480*832" (the reference's MAX_AREA_CONFIGS)."""
    parts = size.replace("x", "*").split("*")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"size must look like '480*832' (H*W), got {size!r}")
    h, w = (int(p) for p in parts)
    if h < 1 or w < 1:
        raise ValueError(f"size must have positive sides, got {size!r}")
    return h * w


def output_size(max_area: int, h0: int, w0: int) -> tuple[int, int]:
    """Output (h, w) in pixels for an h0 x w0 image (spec B.1): 8*lat_h, 8*lat_w."""
    if max_area < 1 or h0 < 1 or w0 < 1:
        raise ValueError(f"need positive max_area and image size, got {max_area}, {h0}x{w0}")
    a = h0 / w0
    lat_h = round(math.sqrt(max_area * a) // 8 // 2 * 2)
    lat_w = round(math.sqrt(max_area / a) // 8 // 2 * 2)
    if lat_h < 2 or lat_w < 2:
        raise ValueError(f"max_area {max_area} is too small for a {h0}x{w0} image")
    return 8 * lat_h, 8 * lat_w


def frame_plan(
    frame_num_requested: int, n_poses: int, chunk_size: int = CHUNK_LATENT_FRAMES
) -> tuple[int, int, int]:
    """(frame_num, lat_f, F) of spec B.1.

    frame_num: source poses kept (4n+1, capped by the trajectory); lat_f: latent frames,
    rounded down to a multiple of chunk_size; F = 4*(lat_f-1)+1: video frames produced.
    """
    if frame_num_requested < 1 or n_poses < 1:
        raise ValueError(f"need frame_num >= 1 and at least one pose, got {frame_num_requested}, {n_poses}")
    s = VAE_TIME_STRIDE
    frame_num = min(s * ((frame_num_requested - 1) // s) + 1, s * ((n_poses - 1) // s) + 1)
    lat_f = (frame_num - 1) // s + 1
    lat_f -= lat_f % chunk_size
    if lat_f == 0:  # said in frames, the user's unit: a chunk is 9 frames first, then 12 more
        first, step = s * (chunk_size - 1) + 1, s * chunk_size
        what = (f"{frame_num_requested} frames" if frame_num_requested <= n_poses
                else f"{n_poses} poses (for {frame_num_requested} frames)")
        raise ValueError(f"{what} make no whole chunk: a video has {first} + {step}k frames "
                         f"({first}, {first + step}, {first + 2 * step}, ...); ask for at least {first}")
    return frame_num, lat_f, s * (lat_f - 1) + 1


def planned_latent_frames(num_frames: int | None) -> int | None:
    """Latent frames of a declared video length (rounded down to whole chunks); None stays None."""
    if num_frames is None:
        return None
    return frame_plan(num_frames, num_frames)[1]


def num_chunks(frame_num: int, chunk_size: int = CHUNK_LATENT_FRAMES) -> int:
    """Chunks of `chunk_size` latent frames produced for a (4n+1) frame_num."""
    return frame_plan(frame_num, frame_num, chunk_size)[1] // chunk_size


def chunk_video_frames(k: int) -> int:
    """Video frames chunk k decodes to: 9 for the first, then 12."""
    return FIRST_CHUNK_VIDEO_FRAMES if k == 0 else CHUNK_VIDEO_FRAMES
