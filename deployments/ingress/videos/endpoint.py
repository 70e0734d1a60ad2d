"""VideoEndpoint: the handlers behind the ingress's `/v1/videos` routes.

    POST   /v1/videos               JSON {image (base64 PNG/JPEG), prompt, poses [N,4,4], intrinsics [N,4],
                                    num_frames (4n+1, default 81), seed?, size?, intrinsics_resolution?}
                                    -> 200 video/mp4
    POST   /v1/videos?async=true    -> 202 job {id, status, progress, ...}
    GET    /v1/videos/{id}          -> the job's progress
    GET    /v1/videos/{id}/content  -> 200 video/mp4 once it succeeded (409 before)
    DELETE /v1/videos/{id}          -> 200 the job's last view; an unfinished job is cancelled
                                       and its session released

Every route passes the WebSocket's checks first (origin, API key); a POST's body must be
declared `application/json` (415 otherwise: what a page of another site can send without a
CORS preflight, `text/plain`, a form, multipart, never starts a job). A job belongs to the
principal that created it: its API key id, or without auth its client address (the peer's,
or the trusted X-Forwarded-For entry as for the connection caps); for anyone else its routes
answer 404 as for an unknown id. A principal has at most `videos.max_jobs_per_principal`
videos (sync requests and unfinished jobs) at once. A body is read with the cap
(`videos.max_body_mib`; the bodies a replica holds at once: twice that, beyond it `busy`),
parsed with a bounded cost off the event loop, validated and planned (request.py), and the
session runs through a `Connection` of this replica with the caller's quota (runner.py).
"""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from deployments.ingress.guards.auth import UNAUTHORIZED_MESSAGE, Auth
from deployments.config import VideoArgs
from deployments.ingress.guards.connection_caps import client_address
from deployments.ingress.videos.errors import HttpError
from deployments.ingress.videos.jobs import JobStore, VideoJob
from deployments.ingress.videos.request import BodyBudget, VideoSpec, check_content_type, parse_request, read_body
from deployments.ingress.videos.runner import SessionRunner
from protocol.errors import ErrorCode
from protocol.limits import Limits

MIB = 1024 * 1024
BODIES_AT_ONCE = 2  # the bytes of this many largest bodies may be held at once (read or parsed)
ASYNC_TRUE = ("1", "true", "yes")


class VideoEndpoint:
    """One per ingress replica: its runner and its jobs."""

    def __init__(self, args: VideoArgs, auth: Auth, limits: Limits, runner: SessionRunner,
                 retry_after_s: float, trust_forwarded_for: bool = False) -> None:
        self._auth = auth
        self._limits = limits
        self._runner = runner
        self._max_body = int(args.max_body_mib * MIB)
        self._bodies = BodyBudget(BODIES_AT_ONCE * self._max_body)
        self._max_frames = args.max_frames
        self._per_principal = args.max_jobs_per_principal
        self._retry_after_s = retry_after_s
        self._trust_forwarded_for = trust_forwarded_for
        self._jobs = JobStore(args.max_jobs, args.job_ttl_s, retry_after_s)
        self._sync: Counter[str] = Counter()  # sync videos running, by principal

    async def create(self, request: Request) -> Response:
        try:
            key_id, owner = self._admit(request)
            check_content_type(request.headers.get("content-type"))  # 415: a browser's no-preflight post
            self._check_quota(owner)  # early: no body read for a principal at its quota
            spec = await self._read(request)
            self._check_quota(owner)  # and again: others may have started while the body came in
            if request.query_params.get("async", "false").lower() in ASYNC_TRUE:
                job = VideoJob(spec.num_frames, spec.num_chunks, owner)
                self._jobs.start(job, lambda on_chunk: self._runner.run(spec.messages, key_id, on_chunk))
                return JSONResponse(job.view(request.url.path.rstrip("/")), 202)
            self._sync[owner] += 1
            try:
                video = await self._runner.run(spec.messages, key_id)
            finally:
                self._sync[owner] -= 1
                if not self._sync[owner]:
                    del self._sync[owner]
        except HttpError as e:
            return e.response()
        return _mp4(video, spec.num_frames)

    def status(self, job_id: str, request: Request) -> JSONResponse:
        try:
            job = self._owned(job_id, request)
        except HttpError as e:
            return e.response()
        return JSONResponse(job.view(request.url.path.rsplit("/", 1)[0]))

    def content(self, job_id: str, request: Request) -> Response:
        try:
            job = self._owned(job_id, request)
        except HttpError as e:
            return e.response()
        if job.error is not None:
            return job.error.response()
        if job.video is None:
            return HttpError.other(409, "not_ready", f"job {job_id} is {job.status.value} ({job.chunks_done}/"
                                                     f"{job.chunks_total} chunks); poll its status").response()
        return _mp4(job.video, job.num_frames)

    async def delete(self, job_id: str, request: Request) -> JSONResponse:
        """Cancel (if unfinished) and drop the caller's job; its last view, status `cancelled`
        when it was still queued or running."""
        try:
            _, owner = self._admit(request)
        except HttpError as e:
            return e.response()
        job = await self._jobs.remove(job_id, owner)
        if job is None:
            return _not_found(job_id).response()
        return JSONResponse(job.view(request.url.path.rsplit("/", 1)[0]))

    def _owned(self, job_id: str, request: Request) -> VideoJob:
        _, owner = self._admit(request)
        job = self._jobs.get(job_id, owner)
        if job is None:
            raise _not_found(job_id)
        return job

    def _admit(self, request: Request) -> tuple[Optional[str], str]:
        """The WebSocket's checks: origin, then API key; (key id, principal). The principal is
        the key id with auth on, else the client address."""
        if not self._auth.origin_allowed(request):
            raise HttpError.other(403, "forbidden", "origin not allowed")
        accepted, key_id = self._auth.authenticate(request)
        if not accepted:
            raise HttpError.of(ErrorCode.UNAUTHORIZED, UNAUTHORIZED_MESSAGE)
        if key_id is not None:
            return key_id, f"key {key_id}"
        return None, f"address {client_address(request, self._trust_forwarded_for)}"

    def _check_quota(self, owner: str) -> None:
        held = self._sync[owner] + self._jobs.active(owner)
        if held >= self._per_principal:
            raise HttpError.of(ErrorCode.BUSY, f"you already have {held} videos queued or running here, the most "
                                               f"one client may (videos.max_jobs_per_principal); wait for one to "
                                               f"finish or DELETE its job", self._retry_after_s)

    async def _read(self, request: Request) -> VideoSpec:
        declared = request.headers.get("content-length")
        size = int(declared) if declared is not None and declared.isdigit() else None
        if size is not None and size > self._max_body:
            raise HttpError.of(ErrorCode.TOO_LARGE, f"the body is over {self._max_body} bytes")
        body = await read_body(request.stream(), self._max_body, self._bodies, size)
        try:
            # ~0.1 s of CPU for a 10 MiB body: in a thread, so that /healthz and the sockets go on
            return await asyncio.to_thread(parse_request, body, self._limits, self._max_frames)
        finally:
            self._bodies.give(len(body))


def _mp4(video: bytes, num_frames: int) -> Response:
    return Response(video, media_type="video/mp4", headers={"X-Video-Frames": str(num_frames)})


def _not_found(job_id: str) -> HttpError:
    return HttpError.other(404, "not_found", f"no job {job_id} on this replica")
