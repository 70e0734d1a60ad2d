"""VideoEndpoint: the handlers behind the ingress's `/v1/videos` routes.

    POST /v1/videos               JSON {image (base64 PNG/JPEG), prompt, poses [N,4,4], intrinsics [N,4],
                                  num_frames (4n+1, default 81), seed?, size?, intrinsics_resolution?}
                                  -> 200 video/mp4
    POST /v1/videos?async=true    -> 202 job {id, status, progress, ...}
    GET  /v1/videos/{id}          -> the job's progress
    GET  /v1/videos/{id}/content  -> 200 video/mp4 once it succeeded (409 before)

A request passes the WebSocket's checks first (origin, API key), then its body is read with
the cap (`videos.max_body_mib`), validated and planned (request.py), and the session runs
through a `Connection` of this replica with the caller's quota (runner.py).
"""
from __future__ import annotations

from typing import Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from deployments.auth import UNAUTHORIZED_MESSAGE, Auth
from deployments.config import VideoArgs
from deployments.videos.errors import HttpError
from deployments.videos.jobs import JobStore, VideoJob
from deployments.videos.request import VideoSpec, parse_request, read_body
from deployments.videos.runner import SessionRunner
from protocol.errors import ErrorCode
from protocol.limits import Limits

MIB = 1024 * 1024
ASYNC_TRUE = ("1", "true", "yes")


class VideoEndpoint:
    """One per ingress replica: its runner and its jobs."""

    def __init__(self, args: VideoArgs, auth: Auth, limits: Limits, runner: SessionRunner,
                 retry_after_s: float) -> None:
        self._auth = auth
        self._limits = limits
        self._runner = runner
        self._max_body = int(args.max_body_mib * MIB)
        self._jobs = JobStore(args.max_jobs, args.job_ttl_s, retry_after_s)

    async def create(self, request: Request) -> Response:
        try:
            key_id = self._admit(request)
            spec = await self._read(request)
            if request.query_params.get("async", "false").lower() in ASYNC_TRUE:
                job = VideoJob(spec.num_frames, spec.num_chunks)
                self._jobs.start(job, lambda on_chunk: self._runner.run(spec.messages, key_id, on_chunk))
                return JSONResponse(job.view(request.url.path.rstrip("/")), 202)
            video = await self._runner.run(spec.messages, key_id)
        except HttpError as e:
            return e.response()
        return _mp4(video, spec.num_frames)

    def status(self, job_id: str, request: Request) -> JSONResponse:
        job = self._jobs.get(job_id)
        if job is None:
            return _not_found(job_id).response()
        return JSONResponse(job.view(request.url.path.rsplit("/", 1)[0]))

    def content(self, job_id: str) -> Response:
        job = self._jobs.get(job_id)
        if job is None:
            return _not_found(job_id).response()
        if job.error is not None:
            return job.error.response()
        if job.video is None:
            return HttpError.other(409, "not_ready", f"job {job_id} is {job.status.value} ({job.chunks_done}/"
                                                     f"{job.chunks_total} chunks); poll its status").response()
        return _mp4(job.video, job.num_frames)

    def _admit(self, request: Request) -> Optional[str]:
        """The WebSocket's checks: origin, then API key; the key id."""
        if not self._auth.origin_allowed(request):
            raise HttpError.other(403, "forbidden", "origin not allowed")
        accepted, key_id = self._auth.authenticate(request)
        if not accepted:
            raise HttpError.of(ErrorCode.UNAUTHORIZED, UNAUTHORIZED_MESSAGE)
        return key_id

    async def _read(self, request: Request) -> VideoSpec:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise HttpError.of(ErrorCode.TOO_LARGE, f"the body is over {self._max_body} bytes")
        return parse_request(await read_body(request.stream(), self._max_body), self._limits)


def _mp4(video: bytes, num_frames: int) -> Response:
    return Response(video, media_type="video/mp4", headers={"X-Video-Frames": str(num_frames)})


def _not_found(job_id: str) -> HttpError:
    return HttpError.other(404, "not_found", f"no job {job_id} on this replica")
