"""Client side: concatenate a session's fMP4 payloads into one MP4 and decode it (decoding
needs PyAV, imported when a decode is asked for: the client's core install has none)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from media.pyav import require_av


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
        av = require_av("decoding frames")
        with av.open(io.BytesIO(self.data), format="mp4") as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return np.stack(frames)


def split_init(payload: bytes) -> tuple[bytes, bytes]:
    """A session's first payload -> (init segment: ftyp + moov, the rest: its first fragment)."""
    pos = 0
    while pos + 8 <= len(payload):
        size = int.from_bytes(payload[pos:pos + 4], "big")
        if payload[pos + 4:pos + 8] == b"moof":
            return payload[:pos], payload[pos:]
        if size < 8:
            break
        pos += size
    raise ValueError("the payload has no fragment (moof) after its init segment")


def decode_fragment(init: bytes, fragment: bytes) -> np.ndarray:
    """One chunk's frames, RGB uint8 [T, H, W, 3]: every chunk starts with an IDR frame
    (media/fmp4.py), so the init segment and its fragment decode alone, as the whole file would."""
    av = require_av("decoding frames")
    with av.open(io.BytesIO(init + fragment), format="mp4") as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
