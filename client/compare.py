"""`lwf-client compare A.mp4 B.mp4 ... -o side_by_side.mp4`: branches played side by side.

Each input is decoded (PyAV) and its frames are placed left to right, GAP_PX of black between
them, top-aligned on a black canvas as tall as the tallest, under a band that names each one
(its file name, or `--labels`) in text drawn into the frames (PIL). The output has as many frames as the
longest input; a shorter one holds its last frame. It is encoded by the project's fMP4 muxer
(media/fmp4.py, H.264 baseline, one fragment per CHUNK_VIDEO_FRAMES frames) at the inputs' rate.
PyAV is imported when a comparison runs: without it (the client's core install) `compare` fails
in one line naming the `video` extra (media/pyav.py), before reading anything.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from camera.frames import CHUNK_VIDEO_FRAMES, FPS
from media.pyav import require_av
from media.reassembly import Fmp4Assembler

GAP_PX = 4
LABEL_MIN_PX = 16  # the label band's height: at least this, else 8 % of the videos' height


def read_frames(path: Path) -> tuple[np.ndarray, int]:
    """RGB uint8 [T, H, W, 3] of a video file and its frame rate (FPS when it says none)."""
    av = require_av("compare")
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


def label_band(labels: Sequence[str], widths: Sequence[int], gap: int, height: int) -> np.ndarray:
    """[band, W, 3] uint8: each label in white on black over its video's columns (shortened to fit)."""
    band = max(LABEL_MIN_PX, round(0.08 * height))
    band += band % 2
    image = Image.new("RGB", (sum(widths) + gap * (len(widths) - 1), band))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(8, round(band * 0.7)))
    x = 0
    for text, w in zip(labels, widths):
        while text and draw.textlength(text, font=font) > w - 4:
            text = text[:-2] + "…" if len(text) > 2 else ""
        draw.text((x + 2, band // 2), text, fill=(255, 255, 255), font=font, anchor="lm")
        x += w + gap
    return np.asarray(image)


def labelled(frames: np.ndarray, videos: Sequence[np.ndarray], labels: Sequence[str], gap: int = GAP_PX) -> np.ndarray:
    """`frames` (side_by_side of `videos`) under a band naming each video; H stays even."""
    band = label_band(labels, [v.shape[2] for v in videos], gap, frames.shape[1])
    out = np.zeros((len(frames), band.shape[0] + frames.shape[1], frames.shape[2], 3), np.uint8)
    out[:, :band.shape[0], :band.shape[1]] = band
    out[:, band.shape[0]:] = frames
    return out


def compare(inputs: Sequence[Path], out: Path, labels: Sequence[str] | None = None) -> tuple[int, tuple[int, int]]:
    """Write the side-by-side MP4 of `inputs` to `out`, each named by its label (default: its
    file name); (frames, (H, W)) written."""
    require_av("compare")  # MissingPyAV before any file is read
    from media.fmp4 import Fmp4Muxer  # encodes with PyAV

    if len(inputs) < 2:
        raise ValueError("compare needs at least two videos")
    if labels is not None and len(labels) != len(inputs):
        raise ValueError(f"--labels names {len(labels)} videos, {len(inputs)} are given")
    decoded = [read_frames(p) for p in inputs]
    videos = [f for f, _ in decoded]
    frames = labelled(side_by_side(videos), videos, labels if labels is not None else [p.name for p in inputs])
    muxer = Fmp4Muxer(frames.shape[2], frames.shape[1], fps=decoded[0][1])
    video = Fmp4Assembler()
    for start in range(0, len(frames), CHUNK_VIDEO_FRAMES):
        video.append(muxer.add_chunk(frames[start:start + CHUNK_VIDEO_FRAMES]))
    video.write(out)
    return len(frames), (frames.shape[1], frames.shape[2])
