"""WorldWriter: a world's chunks written behind the stream, never on the DiT's path.

One per ingress replica. `submit` only appends to a bounded queue (no I/O, no wait: it is
called from the connection's event loop once a chunk is journaled); one background task
writes the queue in order, each chunk through `Worlds.put_chunk` in a worker thread (the
store's calls block), so the loop, the lanes and the replicas never wait for the store.

A store that fails (StoreUnavailable: down, refusing, timing out) degrades the writer to
memory: the chunk stays at the head of the queue and is retried with a backoff (0.2 s doubling
to `max_backoff_s`), the chunks behind it wait in order, `health()` says `degraded`, and when
the store answers again the queue drains: nothing accepted is lost. A slow store shows the same
way: the oldest queued chunk waiting longer than `slow_s` is `degraded` too. The queue holds
at most `max_queue` chunks; a chunk beyond it is refused at once (WriterFull) and the caller
still holds it (the session's journal). A write the store refuses for good (QuotaExceeded, a
world deleted meanwhile, a damaged manifest) is not retried: it is dropped, counted, and passed
to `on_refused` (the caller tells the client with a typed notice). A chunk written is passed to
`on_written` (its session's journal may then let it go over its budget: journal_spill.py).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from deployments.worlds.background import BackgroundTask
from deployments.worlds.chunks import ChunkRecord
from deployments.worlds.errors import StoreUnavailable, WorldError, WriterFull
from deployments.worlds.worlds import Worlds

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ChunkJob:
    principal: str
    world_id: str
    record: ChunkRecord
    previous_y: Optional[np.ndarray]
    queued_at: float = field(default_factory=time.monotonic)


class WorldWriter:
    def __init__(self, worlds: Worlds, max_queue: int = 256, slow_s: float = 2.0, max_backoff_s: float = 5.0,
                 on_refused: Optional[Callable[[ChunkJob, WorldError], None]] = None,
                 on_written: Optional[Callable[[ChunkJob], None]] = None) -> None:
        self.worlds = worlds
        self.max_queue = max_queue
        self.slow_s = slow_s
        self.max_backoff_s = max_backoff_s
        self.on_refused = on_refused
        self.on_written = on_written  # told of each chunk once it is in the store (a journal may spill it)
        self._queue: collections.deque[ChunkJob] = collections.deque()
        self._wake = asyncio.Event()
        self._task = BackgroundTask(self._run, "world-writer")  # the loop below (worlds/background.py)
        self.failing = False  # the last write failed (the store is down or refusing)
        self.last_error = ""
        self.written = self.failures = self.refused = 0
        self.write_s: list[float] = []  # each chunk's time from submit to being in the store (recent 1024)

    def start(self) -> None:
        self._task.start()

    async def close(self) -> None:
        """Stop the task (what is queued stays queued: `flush` first to write it)."""
        await self._task.close()

    def submit(self, principal: str, world_id: str, record: ChunkRecord, previous_y: Optional[np.ndarray]) -> None:
        """Queue a chunk (no I/O); WriterFull when `max_queue` chunks wait already."""
        if len(self._queue) >= self.max_queue:
            raise WriterFull(f"{len(self._queue)} chunks wait for the world store already")
        self._queue.append(ChunkJob(principal, world_id, record, previous_y))
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def pending(self, world_id: str) -> int:
        """Chunks of `world_id` still queued (or being written)."""
        return sum(1 for job in self._queue if job.world_id == world_id)

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is written (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self._queue and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self._queue

    def health(self) -> dict:
        """For /healthz: `degraded` while the store fails or the oldest chunk waits over `slow_s`."""
        oldest = time.monotonic() - self._queue[0].queued_at if self._queue else 0.0
        return {"degraded": self.failing or oldest > self.slow_s, "queued": len(self._queue),
                "oldest_s": round(oldest, 3), "written": self.written, "failures": self.failures,
                "refused": self.refused, "last_error": self.last_error}

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._queue[0]
            try:
                await asyncio.to_thread(self.worlds.put_chunk, job.principal, job.world_id, job.record, job.previous_y)
            except StoreUnavailable as e:
                self.failures += 1
                if not self.failing:
                    log.warning("world store unavailable, chunks kept in memory: %s", e.message)
                self.failing, self.last_error = True, e.message
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            except WorldError as e:  # refused for good: not retried
                self._queue.popleft()
                self.refused += 1
                self.last_error = e.message
                if self.on_refused is not None:
                    self.on_refused(job, e)
                continue
            except Exception as e:  # a bug must not stop the writer: counted as refused, logged
                log.exception("world writer: chunk %d of %s not written", job.record.index, job.world_id)
                self._queue.popleft()
                self.refused += 1
                self.last_error = type(e).__name__
                continue
            self._queue.popleft()
            if self.failing:
                log.warning("world store back: %d chunks still queued", len(self._queue))
            self.failing, backoff = False, 0.2
            self.written += 1
            self.write_s = self.write_s[-1023:] + [time.monotonic() - job.queued_at]
            if self.on_written is not None:
                try:
                    self.on_written(job)
                except Exception:  # noqa: BLE001 - a bug must not stop the writer
                    log.exception("world writer: on_written failed")
