"""A `POST /v1/videos` body -> the session's chunk requests, validated by the protocol codec.

A body must be declared `Content-Type: application/json` (415 otherwise, before it is read).
The body is read as it arrives and refused (413) as soon as it passes the cap, whatever its
Content-Length says (a chunked body has none). Its JSON is parsed with a bounded cost
(json_guard.py: at most the tokens of `4 * max_frames` poses, 8 levels deep; checked before
any object is built), `num_frames` is held to the videos' frame cap, and the whole trajectory is then checked as one
infer by the server's own intake (types, image header, size, num_frames, rigid poses, focal
lengths), so bad input gets the WebSocket's code and message; `camera.plan_session` slices
it as `lwf-client play` does.
"""
from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Optional

import msgpack

from camera import DEFAULT_INTRINSICS_RESOLUTION, plan_session
from deployments.ingress.videos.errors import HttpError
from deployments.ingress.videos.json_guard import load_bounded
from protocol.codec import decode, encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.requests import SessionStart, plan_requests

DEFAULT_NUM_FRAMES = 81
REQUIRED = ("image", "prompt", "poses", "intrinsics")
POSES_PER_FRAME = 4  # the most a trajectory may carry per frame (the wire's 48 per 12-frame chunk)
TOKENS_PER_POSE = 32  # structural JSON tokens of a pose [4, 4] and its intrinsics row [4], with separators
TOKEN_SLACK = 256  # the body's keys, strings and outer brackets
MAX_DEPTH = 8  # the body is 4 deep ({"poses": [[[...]]]})
JSON_BODY = ("the body is one JSON object, {\"image\": base64 PNG or JPEG, \"prompt\", \"poses\", "
             "\"intrinsics\", ...}, not a form upload or a file")
NOT_JSON = f"send JSON (docs/VIDEOS.md): {JSON_BODY}"
JSON_TYPE = "application/json"
NOT_JSON_TYPE = (f"send JSON (docs/VIDEOS.md) with `Content-Type: {JSON_TYPE}` (its charset, if any, utf-8): "
                 f"{JSON_BODY}")


@dataclass(frozen=True)
class VideoSpec:
    """A validated request: the chunk requests of one session and what they produce."""

    messages: list[bytes]
    num_frames: int

    @property
    def num_chunks(self) -> int:
        return len(self.messages)


class BodyBudget:
    """The bytes of `/v1/videos` bodies this replica holds at once, across requests (each is
    at most `videos.max_body_mib`; several at once would multiply it)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def take(self, n: int) -> None:
        """Hold `n` more bytes, or `busy` (503) when they would pass the limit."""
        if self.held + n > self.limit:
            raise HttpError.of(ErrorCode.BUSY, f"this server is reading other video requests' bodies ({self.limit} "
                                               "bytes at once); retry", BODY_RETRY_S)
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


BODY_RETRY_S = 2.0  # retry hint when the replica holds its bodies' budget


async def read_body(chunks: AsyncIterator[bytes], max_bytes: int, budget: BodyBudget,
                    declared: Optional[int] = None) -> bytearray:
    """The body from its chunks as they arrive, held against `budget` (the caller gives its
    length back when done with it); `too_large` (413) as soon as it passes `max_bytes`
    without reading the rest. A `declared` length (Content-Length, at most `max_bytes`) is
    taken from the budget at once, all or nothing, so that bodies arriving together do not
    each get part of it and all fail."""
    taken = 0
    if declared is not None:
        budget.take(declared)
        taken = declared
    body = bytearray()
    try:
        async for chunk in chunks:
            if len(body) + len(chunk) > max_bytes or (declared is not None and len(body) + len(chunk) > declared):
                raise HttpError.of(ErrorCode.TOO_LARGE, f"the body is over {max_bytes} bytes" if declared is None
                                   else "the body is longer than its Content-Length")
            if declared is None:
                budget.take(len(chunk))
                taken += len(chunk)
            body += chunk
    except BaseException:
        budget.give(taken)
        raise
    budget.give(taken - len(body))  # a body shorter than declared
    return body


def check_content_type(value: Optional[str]) -> None:
    """`unsupported_media_type` (415) unless the body is declared `application/json` (a
    `charset` parameter, if any, utf-8: JSON's only encoding). A browser page sends a
    `text/plain`, form or multipart body to another site without asking it first (no CORS
    preflight); `application/json` only after a preflight, which this server never grants."""
    media, *params = (value or "").split(";")
    charsets = [v.strip().strip('"').lower() for k, _, v in (p.partition("=") for p in params)
                if k.strip().lower() == "charset"]
    if media.strip().lower() != JSON_TYPE or any(c != "utf-8" for c in charsets):
        raise HttpError.other(415, "unsupported_media_type", NOT_JSON_TYPE)


def max_tokens(max_frames: int) -> int:
    """The JSON tokens a body with `max_frames` frames' worth of poses may hold."""
    return TOKENS_PER_POSE * POSES_PER_FRAME * max_frames + TOKEN_SLACK


def parse_request(body: bytes | bytearray, limits: Limits, max_frames: int) -> VideoSpec:
    """JSON body -> chunk requests; `HttpError` with the WebSocket's code for bad input.
    CPU-bound on large bodies (~0.1 s for 10 MiB): run it off the event loop.

    `limits`: the server's (the ingress's); the body may hold every pose in one message.
    `max_frames`: the videos' frame cap (`videos.max_frames`)."""
    if not body.lstrip().startswith(b"{"):  # a form upload (multipart), raw image bytes, ...
        raise HttpError.of(ErrorCode.BAD_MESSAGE, NOT_JSON)
    try:
        why = (f": more than {POSES_PER_FRAME * max_frames} poses need; videos have at most {max_frames} frames "
               f"(videos.max_frames)")
        return _spec(load_bounded(body, max_tokens(max_frames), MAX_DEPTH, why), limits, max_frames)
    except ProtocolError as e:
        raise HttpError.of(e.code, e.message) from None


def _spec(body: Any, limits: Limits, max_frames: int) -> VideoSpec:
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "the body must be a JSON object")
    missing = [k for k in REQUIRED if body.get(k) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ProtocolError(ErrorCode.MISSING_FIELD, f"`{'`, `'.join(missing)}` {verb} required")
    image = body["image"]
    if not isinstance(image, str):
        raise ProtocolError(ErrorCode.BAD_IMAGE, "`image` must be a base64 string of a PNG or JPEG file")
    try:
        image_bytes = base64.b64decode(image.split(",", 1)[-1] if image.startswith("data:") else image, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(ErrorCode.BAD_IMAGE, "`image` is not valid base64") from None
    options = {k: body[k] for k in ("prompt", "seed", "size", "intrinsics_resolution") if body.get(k) is not None}
    num_frames = body["num_frames"] if body.get("num_frames") is not None else DEFAULT_NUM_FRAMES
    if isinstance(num_frames, int) and not isinstance(num_frames, bool) and num_frames > max_frames:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`num_frames` is over this server's cap for videos: at most "
                                                 f"{max_frames} frames (videos.max_frames)")
    whole = {"endpoint": "infer", "session_id": "video", "image": image_bytes, "num_frames": num_frames,
             "cameras": {"poses": body["poses"], "intrinsics": body["intrinsics"]}, **options}
    n = len(body["poses"]) if isinstance(body["poses"], list) else 1
    try:
        packed = msgpack.packb(whole, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a number in the body is out of range") from None
    req = decode(packed, replace(limits, max_poses_per_chunk=max(n, 1), max_message_bytes=len(packed)))
    try:
        plan = plan_session(req.cameras.poses, req.cameras.intrinsics, req.num_frames)
    except ValueError as e:  # too few frames or poses for one chunk: the WebSocket's bad_message
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
    start = SessionStart(image_bytes, req.prompt, seed=req.seed, size=req.size,
                         intrinsics_resolution=req.intrinsics_resolution or DEFAULT_INTRINSICS_RESOLUTION)
    messages = [encode(r) for r in plan_requests(plan, f"video-{uuid.uuid4().hex[:12]}", start, limits=limits)]
    return VideoSpec(messages, plan.num_frames)
