"""Lane: a serial FIFO of calls from one connection to one deployment.

Calls a replica makes downstream carry its request's `internal_request_id`; concurrent calls
of one WebSocket request to the same custom-routed deployment were seen to hang in Serve's
router (RAY_SERVE_NOTES §4.1). Every call a connection makes to a deployment therefore goes
through that deployment's lane: at most one in flight, in submission order. The order is
fixed when `submit` is called (synchronously), which is what keeps chunks in order.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

Job = Callable[[], Awaitable[Any]]


class Lane:
    """Runs submitted jobs one at a time, in the order they were submitted."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: asyncio.Queue[tuple[Job, asyncio.Future]] = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"lane-{name}")

    def submit(self, job: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """Queue `job`; the future gets its result or exception."""
        if self._worker.done():
            raise RuntimeError(f"lane {self.name} is stopped; submit before stop()")
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job, fut))
        return fut

    async def stop(self) -> None:
        """Cancel the running job and drop the queued ones (their futures are cancelled)."""
        self._worker.cancel()
        try:
            await self._worker
        except asyncio.CancelledError:
            pass
        while not self._queue.empty():
            self._queue.get_nowait()[1].cancel()

    async def _run(self) -> None:
        while True:
            job, fut = await self._queue.get()
            if fut.cancelled():
                continue
            try:
                result = await job()
            except asyncio.CancelledError:
                fut.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - handed to whoever awaits the future
                if not fut.cancelled():
                    fut.set_exception(e)
            else:
                if not fut.cancelled():
                    fut.set_result(result)
