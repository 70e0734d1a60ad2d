"""The peers' request shapes: recognising them, and reading one into a typed `PeerCall`.

Field facts (vllm-omni PR #3701: examples/online_serving/lingbot_world_fast/openai_client.py,
vllm_omni/entrypoints/openai/realtime/world/camera_*.py): an infer has no `endpoint`, the
clip's whole trajectory in `camera` {poses [N,4,4], intrinsics [N,4]} as openpi `__ndarray__`
maps, `prompt` on every call, `image` (raw RGB uint8 array) on the first call only, and
`extra_body` {height, width, num_frames, fps, seed, frames_per_chunk, session_id}; `session_id`
may be nil (their server then uses one default session). A reset is `{endpoint: reset}`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from camera.frames import CHUNK_VIDEO_FRAMES
from protocol.arrays import wire_array
from protocol.errors import ErrorCode, ProtocolError

DEFAULT_SESSION = "default"  # their server's session when a request names none
DEFAULT_FRAMES_PER_MESSAGE = 4  # their server's CHUNK_FRAMES
# A clip's frames wait in the ingress until a message is full (float32, 11 MB a frame at
# 1280x720): `frames_per_chunk` is bounded by the bytes of one message (replies.py
# check_message_frames; 1e9 with a 4093-pose clip would buffer ~19.6 GB at 464x832).


def _poses_count(obj: dict) -> int:
    cam = obj.get("camera", obj.get("cameras"))
    if not isinstance(cam, dict):
        return 0
    try:
        return int(wire_array(cam.get("poses"), field="camera.poses", code=ErrorCode.BAD_CAMERAS).shape[0])
    except (ProtocolError, IndexError):
        return 0


def is_peer_request(obj: object) -> bool:
    """True for a request only the peers' clients send: no `endpoint` with `extra_body` or a
    nil `session_id`, `camera` with more poses than one chunk, or a reset naming no session."""
    if not isinstance(obj, dict):
        return False
    if obj.get("endpoint") == "reset":
        return not obj.get("session_id")
    if "endpoint" in obj:
        return False
    return "extra_body" in obj or obj.get("session_id") is None or _poses_count(obj) > CHUNK_VIDEO_FRAMES


def _int(body: dict, name: str, lo: int = 1, hi: Optional[int] = None) -> Optional[int]:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        bounds = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`extra_body.{name}` must be an integer {bounds}")
    return v


def _prompt(obj: dict) -> Optional[str]:
    """`prompt`: a string (a number is taken as its text); anything else is refused, never
    turned into text (a list nested 1000 deep would raise RecursionError)."""
    prompt = obj.get("prompt")
    if prompt is None or isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (int, float)) and not isinstance(prompt, bool):
        return str(prompt)
    raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`prompt` must be a string, got {type(prompt).__name__}")


@dataclass(frozen=True)
class PeerCall:
    """One peer infer, typed: a clip of N poses and what `extra_body` asked for."""

    session_id: str
    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [N, 4]
    prompt: Optional[str]
    image: Optional[bytes | np.ndarray]
    num_frames: Optional[int]
    seed: Optional[int]
    size: Optional[str]  # "H*W" from height and width
    frames_per_message: int


def session_of(obj: dict) -> str:
    body = obj.get("extra_body") if isinstance(obj.get("extra_body"), dict) else {}
    sid = obj.get("session_id") or body.get("session_id") or DEFAULT_SESSION
    if not isinstance(sid, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`session_id` must be a string (or left out)")
    return sid


def read_call(obj: dict) -> PeerCall:
    """A peer infer -> PeerCall; ProtocolError (bad_cameras, bad_message, missing_field)."""
    body = obj.get("extra_body", {}) or {}
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`extra_body` must be a map")
    cam = obj.get("camera", obj.get("cameras"))
    if not isinstance(cam, dict) or "poses" not in cam or "intrinsics" not in cam:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "`camera` {poses [N,4,4], intrinsics [N,4]} is required")
    poses = wire_array(cam["poses"], field="camera.poses", code=ErrorCode.BAD_CAMERAS)
    intrinsics = wire_array(cam["intrinsics"], field="camera.intrinsics", code=ErrorCode.BAD_CAMERAS)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or intrinsics.shape != (poses.shape[0], 4):
        raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`camera` must hold poses [N, 4, 4] and intrinsics [N, 4], got "
                                                   f"{list(poses.shape)} and {list(intrinsics.shape)}")
    height, width = _int(body, "height"), _int(body, "width")
    if (height is None) != (width is None):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`extra_body` needs both `height` and `width`, or neither")
    seed = obj.get("seed", body.get("seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`seed` must be an integer")
    return PeerCall(
        session_id=session_of(obj), poses=poses.astype(np.float32), intrinsics=intrinsics.astype(np.float32),
        prompt=_prompt(obj),
        image=obj.get("image"), num_frames=_int(body, "num_frames"), seed=seed,
        size=None if height is None else f"{height}*{width}",
        frames_per_message=_int(body, "frames_per_chunk") or DEFAULT_FRAMES_PER_MESSAGE,
    )
