"""Our replies -> the peers' messages.

Their client reads every message with openpi's `msgpack_numpy.unpackb`, which turns a map
with the *bytes* keys `__ndarray__`, `data`, `dtype`, `shape` into an array, and expects
`{type: "frame", index, total, video}` with `video` float32 [T, H, W, 3] in [0, 1] until it has
`total` messages; `{type: "error", message}` makes it stop; a reset is answered with the text
"reset successful". A clip's frames come from several of our chunks (9, then 12 each): they are
cut into messages of `frames_per_message` frames as each chunk decodes, the last one shorter.
"""
from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import ErrorReply, FrameReply

RESET_TEXT = "reset successful"  # their server's reset reply (a text frame)
RESET_REPLY = {"type": "reset", "message": RESET_TEXT}  # on the openpi route: a map (openpi's infer() raises on text)


def _openpi_array(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def pack(message: dict) -> bytes:
    """One peer message, arrays in openpi's encoding."""
    return msgpack.packb(message, use_bin_type=True, default=_openpi_array)


def frames_of(reply: FrameReply) -> np.ndarray:
    """A raw-frames chunk (`FrameReply.video`: RGB uint8 [T, H, W, 3] bytes) -> float32 in [0, 1]."""
    h, w = reply.resolution
    rgb = np.frombuffer(reply.video, np.uint8).reshape(reply.num_frames, h, w, 3)
    return rgb.astype(np.float32) / np.float32(255.0)


def error_message(reply: ErrorReply) -> dict:
    """Their error shape (`message`), with our code and session beside it."""
    out: dict[str, Any] = {"type": "error", "code": reply.code.value, "message": reply.message}
    if reply.session_id is not None:
        out["session_id"] = reply.session_id
    if reply.retry_after_s is not None:
        out["retry_after_s"] = reply.retry_after_s
    return out


MESSAGE_MAX_BYTES = 1 << 30  # a message's frames wait in the ingress until it is full: at most this


def check_message_frames(frames: int, limits: Limits) -> None:
    """Refuse a clip whose messages could hold more than MESSAGE_MAX_BYTES at the largest
    output size (`max_output_area`, float32 RGB): the ingress buffers a message's frames until
    it is full (`frames_per_chunk`, or the whole clip on the openpi route)."""
    per_frame = limits.max_output_area * 3 * np.dtype(np.float32).itemsize
    most = max(1, MESSAGE_MAX_BYTES // per_frame)
    if frames > most:
        raise ProtocolError(ErrorCode.TOO_LARGE, (
            f"{frames} frames in one message; at most {most} here (a message is at most "
            f"{MESSAGE_MAX_BYTES >> 20} MiB at the largest output size): a smaller frames_per_chunk, or split "
            "the trajectory into clips"))


class ClipFrames:
    """One clip's frames: buffered across our chunks, sent `per_message` at a time."""

    def __init__(self, chunks: int, frames: int, per_message: int) -> None:
        self.chunks_left = chunks  # our replies still to come for this clip
        self.frames = frames
        self.per_message = per_message
        self.total = math.ceil(frames / per_message)
        self._index = 0
        self._pending: list[np.ndarray] = []
        self.failed = False

    def add(self, frames: np.ndarray) -> list[bytes]:
        """One chunk's frames -> the messages now complete (all of them after the last chunk)."""
        self.chunks_left -= 1
        self._pending.append(frames)
        buf = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        out = []
        while len(buf) >= self.per_message or (self.chunks_left == 0 and len(buf)):
            out.append(pack({"type": "frame", "index": self._index, "total": self.total,
                             "video": np.ascontiguousarray(buf[:self.per_message])}))
            self._index += 1
            buf = buf[self.per_message:]
        self._pending = [buf] if len(buf) else []
        return out
