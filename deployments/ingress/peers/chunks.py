"""A peer clip -> our chunk infers, and how many frames they produce.

The first clip of a session is planned like an offline run of its trajectory
(`camera.plan_session`: chunk k gets poses[12k:12k+12], 9 frames for chunk 0, 12 after; a
length that is not 12k - 3 is sampled at the reference's fractional positions), and declares
the plan's `translation_scale`, seed and size. It declares no `num_frames`: the session stays
open-ended so that an extension call can continue it. An extension clip continues the open
session: each whole 12 poses are one more chunk of 12 frames (a shorter tail is not produced).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from camera.frames import CHUNK_VIDEO_FRAMES
from camera.plan import plan_session
from deployments.ingress.peers.peer import PeerCall
from protocol.codec import encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.requests import SessionStart, infer_request


@dataclass(frozen=True)
class ClipChunks:
    """Our packed infers for one clip, and the video frames they produce in all."""

    infers: tuple[bytes, ...]
    frames: int


def first_clip(call: PeerCall, limits: Limits) -> ClipChunks:
    """The infers that start a session from `call` (image and prompt required)."""
    if call.image is None:
        raise ProtocolError(ErrorCode.SESSION_LOST, (
            f"session {call.session_id!r} is not open on this connection: a clip without `image` continues a "
            "session, and this server does not keep sessions across connections (resume is off); send "
            "`image` to start the session again"))
    if call.prompt is None:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "`prompt` is required on a session's first clip")
    n = len(call.poses)
    if n > limits.max_num_frames:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"a clip of {n} poses; at most {limits.max_num_frames}")
    try:
        plan = plan_session(call.poses, call.intrinsics, min(call.num_frames or n, n))
    except ValueError as e:
        raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`camera`: {e}") from None
    start = SessionStart(call.image, call.prompt, seed=call.seed, size=call.size,
                         translation_scale=plan.translation_scale)
    infers = tuple(encode(infer_request(call.session_id, poses, plan.chunk_intrinsics(k), start=None if k else start,
                                        client_chunk_id=k, limits=limits))
                   for k, poses in enumerate(plan.chunk_poses))
    return ClipChunks(infers, plan.num_frames)


def extension_clip(call: PeerCall, next_chunk: int, limits: Limits, resume_token: Optional[str] = None) -> ClipChunks:
    """The infers that continue the open session with `call`'s poses (12 per chunk); the
    first carries `resume_token` when the session is to be resumed on this connection."""
    chunks = len(call.poses) // CHUNK_VIDEO_FRAMES
    if chunks == 0:
        raise ProtocolError(ErrorCode.BAD_CAMERAS, f"an extension clip needs at least {CHUNK_VIDEO_FRAMES} poses "
                                                   f"(one chunk of {CHUNK_VIDEO_FRAMES} frames), got {len(call.poses)}")
    infers = tuple(
        encode(infer_request(call.session_id, call.poses[_span(k)], call.intrinsics[_span(k)], prompt=call.prompt,
                             client_chunk_id=next_chunk + k, resume_token=resume_token if k == 0 else None,
                             limits=limits))
        for k in range(chunks))
    return ClipChunks(infers, chunks * CHUNK_VIDEO_FRAMES)


def _span(k: int) -> slice:
    return slice(CHUNK_VIDEO_FRAMES * k, CHUNK_VIDEO_FRAMES * (k + 1))
