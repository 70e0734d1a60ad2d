"""Client side: concatenate a session's fMP4 payloads into one MP4 and decode it."""
from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np


class Fmp4Assembler:
    """Collects the `video` payloads of one session in order."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def append(self, payload: bytes) -> None:
        if not self._parts and payload[4:8] != b"ftyp":
            raise ValueError("the first payload of a session must start with the init segment (ftyp)")
        self._parts.append(payload)

    def __len__(self) -> int:
        return len(self._parts)

    @property
    def data(self) -> bytes:
        """The MP4 file so far."""
        return b"".join(self._parts)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.data)
        return path

    def decode_frames(self) -> np.ndarray:
        """All frames so far as RGB uint8 [T, H, W, 3] (decoded with PyAV)."""
        if not self._parts:
            raise ValueError("no payloads appended yet")
        with av.open(io.BytesIO(self.data), format="mp4") as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return np.stack(frames)
