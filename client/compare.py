"""`lwf-client compare A.mp4 B.mp4 ... -o side_by_side.mp4`: branches played side by side.

Each input is decoded (PyAV) and its frames are placed left to right, GAP_PX of black between
them, top-aligned on a black canvas as tall as the tallest. The output has as many frames as the
longest input; a shorter one holds its last frame. It is encoded by the project's fMP4 muxer
(media/fmp4.py, H.264 baseline, one fragment per CHUNK_VIDEO_FRAMES frames) at the inputs' rate.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np

from camera.frames import CHUNK_VIDEO_FRAMES, FPS
from media.fmp4 import Fmp4Muxer
from media.reassembly import Fmp4Assembler

GAP_PX = 4


def read_frames(path: Path) -> tuple[np.ndarray, int]:
    """RGB uint8 [T, H, W, 3] of a video file and its frame rate (FPS when it says none)."""
    try:
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            rate = stream.average_rate or stream.base_rate
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    except (av.error.FFmpegError, IndexError, OSError) as e:
        raise ValueError(f"{path}: not a readable video ({e})") from None
    if not frames:
        raise ValueError(f"{path}: the video has no frames")
    return np.stack(frames), int(round(float(rate))) if rate else FPS


def side_by_side(videos: Sequence[np.ndarray], gap: int = GAP_PX) -> np.ndarray:
    """[T, H, W, 3] uint8 of the videos left to right (T: the longest; H, W rounded up to even)."""
    if not videos:
        raise ValueError("nothing to compare")
    length = max(len(v) for v in videos)
    height = max(v.shape[1] for v in videos)
    width = sum(v.shape[2] for v in videos) + gap * (len(videos) - 1)
    out = np.zeros((length, height + height % 2, width + width % 2, 3), np.uint8)
    x = 0
    for v in videos:
        h, w = v.shape[1:3]
        out[:len(v), :h, x:x + w] = v
        out[len(v):, :h, x:x + w] = v[-1]  # a shorter video holds its last frame
        x += w + gap
    return out


def compare(inputs: Sequence[Path], out: Path) -> tuple[int, tuple[int, int]]:
    """Write the side-by-side MP4 of `inputs` to `out`; (frames, (H, W)) written."""
    if len(inputs) < 2:
        raise ValueError("compare needs at least two videos")
    decoded = [read_frames(p) for p in inputs]
    frames = side_by_side([f for f, _ in decoded])
    muxer = Fmp4Muxer(frames.shape[2], frames.shape[1], fps=decoded[0][1])
    video = Fmp4Assembler()
    for start in range(0, len(frames), CHUNK_VIDEO_FRAMES):
        video.append(muxer.add_chunk(frames[start:start + CHUNK_VIDEO_FRAMES]))
    video.write(out)
    return len(frames), (frames.shape[1], frames.shape[2])
