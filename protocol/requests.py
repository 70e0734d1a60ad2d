"""The requests a client sends, built as the wire's models (`protocol.messages`) from typed
arguments; `protocol.codec.encode` packs them. A bad value fails here with the `ProtocolError`
code the server would answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from protocol.codec import validated
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import DriveRequest, InferRequest


@dataclass(frozen=True, slots=True)
class SessionStart:
    """What a session's first request declares (PROTOCOL.md §2): the start image (PNG/JPEG bytes
    or RGB uint8 [H, W, 3]) and prompt, and the session's options (None: the server's default)."""

    image: bytes | np.ndarray
    prompt: str
    seed: Optional[int] = None
    size: Optional[str] = None  # max output area "H*W"
    num_frames: Optional[int] = None  # None: open-ended
    translation_scale: Optional[float] = None
    intrinsics_resolution: Optional[tuple[int, int]] = None
    prefix_cache: Optional[bool] = None  # False keeps the session out of the server's prefix store

    def fields(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


def infer_request(session_id: str, poses: Optional[np.ndarray] = None, intrinsics: Optional[np.ndarray] = None, *,
                  start: Optional[SessionStart] = None, from_keys: bool = False,
                  prompt_update: Optional[str] = None, client_chunk_id: Optional[int] = None,
                  limits: Limits = DEFAULT_LIMITS) -> InferRequest:
    """One chunk's infer: its cameras (poses [N, 4, 4], intrinsics [N, 4]), or `from_keys` (the
    keys held move the camera); `start` on a session's first."""
    if (poses is None) != (intrinsics is None):
        raise ValueError("give poses and intrinsics together")
    fields = {"session_id": session_id, "from_keys": from_keys or None, "prompt_update": prompt_update,
              "client_chunk_id": client_chunk_id,
              "cameras": None if poses is None else {"poses": poses, "intrinsics": intrinsics},
              **(start.fields() if start is not None else {})}
    return validated(InferRequest, fields, limits)


def drive_request(session_id: str, start: SessionStart, limits: Limits = DEFAULT_LIMITS) -> DriveRequest:
    """A session the server runs by itself from the keys held (PROTOCOL.md, `drive`)."""
    fields = start.fields()
    if fields.pop("prefix_cache") is not None:
        raise ValueError("a driven session has no prefix_cache option")
    return validated(DriveRequest, {"session_id": session_id, **fields}, limits)
