"""Async video jobs (`POST /v1/videos?async=true`) of one ingress replica, bounded.

The store holds at most `videos.max_jobs` jobs: queued, running, or finished with their
result. A finished job is dropped once its result is `videos.job_ttl_s` old, or earlier, oldest
first, when a new job needs its place; while every place is taken by unfinished jobs a new one
is refused (`busy`, 503 with Retry-After). Jobs live in this replica's memory: poll the replica
that accepted them (one ingress replica, or sticky routing).

A job belongs to its owner (the principal that created it, endpoint.py): `get` and `remove`
find it only for that owner, so another principal cannot tell it from an unknown id. `remove`
cancels an unfinished job (its session is released as its runner ends) and drops it.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from deployments.ingress.videos.errors import HttpError
from protocol.errors import ErrorCode


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by `DELETE /v1/videos/{id}` (only in that answer: the job is dropped)


CANCEL_WAIT_S = 10.0  # how long `remove` waits for a cancelled job's runner to release its session


@dataclass(eq=False)
class VideoJob:
    num_frames: int
    chunks_total: int
    owner: str  # the principal that created it (an API key id, or a client address)
    id: str = field(default_factory=lambda: f"vid_{uuid.uuid4().hex}")
    created_at: float = field(default_factory=time.time)
    status: JobStatus = JobStatus.QUEUED
    chunks_done: int = 0
    finished_at: Optional[float] = None  # on the store's clock
    video: Optional[bytes] = None
    error: Optional[HttpError] = None
    task: Optional[asyncio.Task] = None

    @property
    def finished(self) -> bool:
        return self.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

    def advance(self, k: int) -> None:
        """Chunk k was answered."""
        self.chunks_done = k + 1

    def view(self, base: str) -> dict[str, Any]:
        out = {"id": self.id, "object": "video.job", "status": self.status.value, "created_at": self.created_at,
               "num_frames": self.num_frames, "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
               "progress": self.chunks_done / self.chunks_total, "status_url": f"{base}/{self.id}",
               "content_url": f"{base}/{self.id}/content"}
        if self.error is not None:
            out["error"] = self.error.body
        return out


class JobStore:
    """The jobs of this ingress replica (see the module docstring)."""

    def __init__(self, max_jobs: int, ttl_s: float, retry_after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self.ttl_s = ttl_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._jobs: dict[str, VideoJob] = {}  # in creation order

    def __len__(self) -> int:
        self._expire()
        return len(self._jobs)

    def start(self, job: VideoJob, work: Callable[[Callable[[int], None]], Awaitable[bytes]]) -> None:
        """Hold `job` and run `work(on_chunk)` as its task; `HttpError` busy when full."""
        self._expire()
        if len(self._jobs) >= self.max_jobs:
            oldest = next((j for j in self._jobs.values() if j.finished), None)
            if oldest is None:
                raise HttpError.of(ErrorCode.BUSY, f"this server already runs {len(self._jobs)} video jobs, the most "
                                                   f"it holds; retry in {self.retry_after_s:g} s", self.retry_after_s)
            del self._jobs[oldest.id]
        self._jobs[job.id] = job
        job.task = asyncio.create_task(self._run(job, work))

    def get(self, job_id: str, owner: str) -> Optional[VideoJob]:
        """The job `job_id` if `owner` created it, else None (as for an unknown id)."""
        self._expire()
        job = self._jobs.get(job_id)
        return job if job is not None and job.owner == owner else None

    def active(self, owner: str) -> int:
        """The unfinished (queued or running) jobs of `owner`."""
        return sum(1 for j in self._jobs.values() if j.owner == owner and not j.finished)

    async def remove(self, job_id: str, owner: str) -> Optional[VideoJob]:
        """Drop `owner`'s job `job_id` (None if there is none); an unfinished one is cancelled
        first and waited for (up to CANCEL_WAIT_S) while its runner releases the session."""
        job = self.get(job_id, owner)
        if job is None:
            return None
        del self._jobs[job.id]
        if not job.finished and job.task is not None:
            job.task.cancel()
            job.status, job.finished_at = JobStatus.CANCELLED, self._clock()
            await asyncio.wait({job.task}, timeout=CANCEL_WAIT_S)
        return job

    async def _run(self, job: VideoJob, work: Callable[[Callable[[int], None]], Awaitable[bytes]]) -> None:
        job.status = JobStatus.RUNNING
        try:
            job.video, job.status = await work(job.advance), JobStatus.SUCCEEDED
        except HttpError as e:
            job.error, job.status = e, JobStatus.FAILED
        except Exception as e:  # noqa: BLE001 - the job's edge: a failure becomes its error
            job.error = HttpError.other(500, "internal", f"{type(e).__name__}: {e}")
            job.status = JobStatus.FAILED
        job.finished_at = self._clock()

    def _expire(self) -> None:
        now = self._clock()
        for job in [j for j in self._jobs.values() if j.finished and now - j.finished_at > self.ttl_s]:
            del self._jobs[job.id]
