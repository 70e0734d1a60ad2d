"""Offline endpoint: a whole trajectory -> one MP4 (`POST /v1/videos`), or a job for long ones.

    POST /v1/videos               JSON {image (base64 PNG/JPEG), prompt, poses [N,4,4], intrinsics [N,4],
                                  num_frames (4n+1, default 81), seed?, size?, intrinsics_resolution?}
                                  -> 200 video/mp4
    POST /v1/videos?async=true    -> 202 job {id, status, progress, ...}
    GET  /v1/videos/{id}          -> the job's progress
    GET  /v1/videos/{id}/content  -> 200 video/mp4 once it succeeded (409 before)

The session runs through the very code that serves the WebSocket: the ingress's camera handler
(auth, `Connection`, lanes, streams) on an in-process socket, fed by the client's streamer
with the chunk requests `lwf-client play` sends. So the video equals the streamed one, and
inputs are validated by the protocol codec with the same error codes (as HTTP statuses).
Jobs live in the memory of the ingress replica that accepted them (poll the same replica:
one ingress replica, or sticky routing).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import msgpack
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.datastructures import Headers, QueryParams
from starlette.websockets import WebSocketState

from camera import DEFAULT_INTRINSICS_RESOLUTION
from client.errors import ServerError
from client.streaming import stream_session
from client.trajectory import Trajectory, plan_session
from protocol.codec import decode, decode_reply
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import CameraServerConfig, ErrorReply, Reply

ROUTE = "/v1/videos"
DEFAULT_NUM_FRAMES = 81
PIPELINE = 2  # chunk k+1's DiT step overlaps chunk k's decode (within sessions.max_pending_chunks)
MAX_BODY_BYTES = 64 * 1024 * 1024
UNCAPPED = 2**31 - 1
MAX_JOBS = 64  # finished jobs kept per ingress replica (the oldest are dropped first)
JOB_TTL_S = 3600.0
HTTP_STATUS = {
    ErrorCode.BAD_MESSAGE: 400, ErrorCode.MISSING_FIELD: 400, ErrorCode.BAD_CAMERAS: 400,
    ErrorCode.BAD_IMAGE: 400, ErrorCode.TOO_LARGE: 413, ErrorCode.SESSION_LOST: 503,
    ErrorCode.BUSY: 503, ErrorCode.UNAUTHORIZED: 401,
}
_POLICY_VIOLATION = 1008


@dataclass(frozen=True)
class HttpError:
    """A failed request: HTTP status and a JSON body shaped like the wire's `error` reply."""

    status: int
    body: dict[str, Any]
    retry_after_s: Optional[float] = None

    @classmethod
    def of(cls, code: ErrorCode, message: str, retry_after_s: Optional[float] = None) -> HttpError:
        retry = retry_after_s if code is ErrorCode.BUSY else None
        reply = ErrorReply(code=code, message=message, retry_after_s=retry)
        return cls(HTTP_STATUS[code], reply.model_dump(mode="json", exclude_none=True), retry)

    def response(self) -> JSONResponse:
        headers = None if self.retry_after_s is None else {"Retry-After": str(max(1, round(self.retry_after_s)))}
        return JSONResponse(self.body, self.status, headers=headers)


def _not_found(job_id: str) -> JSONResponse:
    return JSONResponse({"type": "error", "code": "not_found", "message": f"no job {job_id} on this replica"}, 404)


# ---- request -> trajectory (validated by the protocol codec) ----

@dataclass(frozen=True)
class VideoSpec:
    """A validated request: the chunk requests of one session and what they produce."""

    messages: list[bytes]
    num_frames: int
    num_chunks: int


def parse_request(body: Any) -> VideoSpec:
    """JSON body -> chunk requests; `ProtocolError` with the WebSocket's code for bad input."""
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "the body must be a JSON object")
    missing = [k for k in ("image", "prompt", "poses", "intrinsics") if body.get(k) is None]
    if missing:
        raise ProtocolError(ErrorCode.MISSING_FIELD, f"`{'`, `'.join(missing)}` {'is' if len(missing) == 1 else 'are'} "
                                                     "required")
    image = body["image"]
    if not isinstance(image, str):
        raise ProtocolError(ErrorCode.BAD_IMAGE, "`image` must be a base64 string of a PNG or JPEG file")
    try:
        image_bytes = base64.b64decode(image.split(",", 1)[-1] if image.startswith("data:") else image, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(ErrorCode.BAD_IMAGE, "`image` is not valid base64") from None
    options = {k: body[k] for k in ("prompt", "seed", "size", "intrinsics_resolution") if body.get(k) is not None}
    whole = {"endpoint": "infer", "session_id": "video", "image": image_bytes,
             "num_frames": body.get("num_frames", DEFAULT_NUM_FRAMES),
             "cameras": {"poses": body["poses"], "intrinsics": body["intrinsics"]}, **options}
    # The whole trajectory as one infer: the server's own intake (types, image header, size,
    # num_frames, rigid poses, focal lengths), with room for all N poses in one message. The
    # server's cap on num_frames applies when the session starts (its first chunk).
    n = len(body["poses"]) if isinstance(body["poses"], list) else 1
    limits = replace(DEFAULT_LIMITS, max_poses_per_chunk=max(n, 1), max_message_bytes=MAX_BODY_BYTES,
                     max_num_frames=UNCAPPED)
    try:
        packed = msgpack.packb(whole, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a number in the body is out of range") from None
    req = decode(packed, limits)
    traj = Trajectory(image=image_bytes, prompt=req.prompt, poses=req.cameras.poses, intrinsics=req.cameras.intrinsics,
                      intrinsics_resolution=req.intrinsics_resolution or DEFAULT_INTRINSICS_RESOLUTION)
    try:
        plan = plan_session(traj, req.num_frames)
    except ValueError as e:  # too few frames or poses for one chunk: the WebSocket's bad_message
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
    sid = f"video-{uuid.uuid4().hex[:12]}"
    return VideoSpec(traj.messages(plan, sid, seed=req.seed, size=req.size), plan.num_frames, plan.num_chunks)


# ---- an in-process WebSocket for the ingress's camera handler ----

class SocketClosed(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"socket closed ({code}: {reason})")
        self.code, self.reason = code, reason


class LoopbackSocket:
    """Server side: the part of Starlette's WebSocket the camera handler uses."""

    def __init__(self, headers: Headers, query_params: QueryParams) -> None:
        self.headers = headers  # the HTTP request's, so that auth sees its credentials
        self.query_params = query_params
        self.application_state = WebSocketState.CONNECTING
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[bytes | SocketClosed] = asyncio.Queue()

    async def accept(self) -> None:
        self.application_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        self.outbox.put_nowait(data)

    async def close(self, code: int = 1000, reason: Optional[str] = None) -> None:
        self.application_state = WebSocketState.DISCONNECTED
        self.outbox.put_nowait(SocketClosed(code, reason or ""))


class Loopback:
    """A client of the ingress's camera handler over an in-process `LoopbackSocket` (the
    streamer's `Channel`), connecting as `caller` (its credentials and origin)."""

    def __init__(self, caller: Request) -> None:
        self._socket = LoopbackSocket(caller.headers, caller.query_params)
        self._handler: Optional[asyncio.Task] = None

    async def open(self) -> None:
        """Start the handler and read its handshake; `ServerError` (e.g. unauthorized) or
        `SocketClosed` (e.g. origin refused) when it does not serve us."""
        ingress = serve.get_replica_context().servable_object
        self._handler = asyncio.create_task(ingress.camera(self._socket))
        try:
            hello = await self.receive()
            if isinstance(hello, ErrorReply):
                raise ServerError.from_reply(hello)
            assert isinstance(hello, CameraServerConfig), hello
        except BaseException:
            await self.close()
            raise

    async def send(self, data: bytes) -> None:
        self._socket.inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    async def receive(self, timeout_s: Optional[float] = None) -> Reply:
        item = await asyncio.wait_for(self._socket.outbox.get(), timeout_s)
        if isinstance(item, SocketClosed):
            raise item
        return decode_reply(item)

    async def close(self) -> None:
        """Disconnect: the handler releases the session, as for a closed WebSocket."""
        self._socket.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        await asyncio.gather(self._handler, return_exceptions=True)


async def connect(caller: Request) -> Loopback | HttpError:
    """An open loopback, or the HTTP error for a refusal."""
    loopback = Loopback(caller)
    try:
        await loopback.open()
    except (ServerError, SocketClosed) as e:
        return http_error(e)
    return loopback


async def render(loopback: Loopback, spec: VideoSpec, job: Optional[VideoJob] = None) -> bytes | HttpError:
    """Stream the session's chunks through an open loopback (closed after); the MP4 bytes."""
    on_chunk = None if job is None else (lambda stat, reply: job.advance())
    try:
        result = await stream_session(loopback, spec.messages, pipeline=PIPELINE, on_chunk=on_chunk)
    except (ServerError, SocketClosed) as e:
        return http_error(e)
    finally:
        await loopback.close()
    return result.video.data


def http_error(e: ServerError | SocketClosed) -> HttpError:
    if isinstance(e, ServerError):
        return HttpError.of(e.code, e.message, e.retry_after_s)
    # closed before accept (origin refused: policy) or a fatal server error
    forbidden = e.code == _POLICY_VIOLATION
    return HttpError(403 if forbidden else 500, {"type": "error", "code": "forbidden" if forbidden else "internal",
                                                 "message": e.reason})


# ---- jobs ----

@dataclass(eq=False)
class VideoJob:
    id: str
    num_frames: int
    chunks_total: int
    created_at: float = field(default_factory=time.time)
    status: str = "queued"  # queued | running | succeeded | failed
    chunks_done: int = 0
    video: Optional[bytes] = None
    error: Optional[HttpError] = None
    task: Optional[asyncio.Task] = None

    def advance(self) -> None:
        self.chunks_done += 1

    def view(self, base: str) -> dict[str, Any]:
        out = {"id": self.id, "object": "video.job", "status": self.status, "created_at": self.created_at,
               "num_frames": self.num_frames, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
               "progress": self.chunks_done / self.chunks_total, "status_url": f"{base}/{self.id}",
               "content_url": f"{base}/{self.id}/content"}
        if self.error is not None:
            out["error"] = self.error.body
        return out

    async def run(self, loopback: Loopback, spec: VideoSpec) -> None:
        self.status = "running"
        try:
            out = await render(loopback, spec, self)
        except Exception as e:  # noqa: BLE001 - the job's edge: a failure becomes its error
            out = HttpError(500, {"type": "error", "code": "internal", "message": f"{type(e).__name__}: {e}"})
        if isinstance(out, bytes):
            self.video, self.status = out, "succeeded"
        else:
            self.error, self.status = out, "failed"


class JobStore:
    """The jobs of this ingress replica; finished ones expire after JOB_TTL_S or beyond MAX_JOBS."""

    def __init__(self) -> None:
        self._jobs: dict[str, VideoJob] = {}

    def add(self, job: VideoJob) -> None:
        now = time.time()
        done = [j for j in self._jobs.values() if j.status in ("succeeded", "failed")]
        for j in done:
            if now - j.created_at > JOB_TTL_S or len(self._jobs) >= MAX_JOBS:
                del self._jobs[j.id]
        self._jobs[job.id] = job

    def get(self, job_id: str) -> Optional[VideoJob]:
        return self._jobs.get(job_id)


# ---- routes ----

def mount_videos(app: FastAPI) -> None:
    """Add the /v1/videos routes to the ingress app (before `serve.ingress` freezes it)."""
    jobs = JobStore()  # one per replica process (the app is copied into each)

    async def create_video(request: Request) -> Response:
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            return HttpError.of(ErrorCode.TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes").response()
        loopback = await connect(request)  # the WebSocket's checks first: API key, origin
        if isinstance(loopback, HttpError):
            return loopback.response()
        try:
            spec = parse_request(json.loads(await request.body()))
        except ValueError as e:  # ProtocolError is a ValueError
            await loopback.close()
            code, msg = (e.code, e.message) if isinstance(e, ProtocolError) else (
                ErrorCode.BAD_MESSAGE, "the body must be one JSON object")
            return HttpError.of(code, msg).response()
        if request.query_params.get("async", "false").lower() in ("1", "true", "yes"):
            job = VideoJob(f"vid_{uuid.uuid4().hex}", spec.num_frames, spec.num_chunks)
            jobs.add(job)
            job.task = asyncio.create_task(job.run(loopback, spec))
            return JSONResponse(job.view(request.url.path.rstrip("/")), 202)
        out = await render(loopback, spec)
        if isinstance(out, HttpError):
            return out.response()
        return Response(out, media_type="video/mp4", headers={"X-Video-Frames": str(spec.num_frames)})

    async def video_status(job_id: str, request: Request) -> JSONResponse:
        job = jobs.get(job_id)
        if job is None:
            return _not_found(job_id)
        return JSONResponse(job.view(request.url.path.rsplit("/", 1)[0]))

    async def video_content(job_id: str) -> Response:
        job = jobs.get(job_id)
        if job is None:
            return _not_found(job_id)
        if job.error is not None:
            return job.error.response()
        if job.video is None:
            return JSONResponse({"type": "error", "code": "not_ready", "message": (
                f"job {job_id} is {job.status} ({job.chunks_done}/{job.chunks_total} chunks); poll its status")}, 409)
        return Response(job.video, media_type="video/mp4", headers={"X-Video-Frames": str(job.num_frames)})

    app.add_api_route(ROUTE, create_video, methods=["POST"], response_class=Response)
    app.add_api_route(ROUTE + "/{job_id}", video_status, methods=["GET"])
    app.add_api_route(ROUTE + "/{job_id}/content", video_content, methods=["GET"], response_class=Response)
