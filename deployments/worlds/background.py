"""BackgroundTask: one named asyncio task a long-lived part runs beside its event loop's work
(the world writer's queue, writer.py; the ingress's retention sweeps, ingress/worlds/retention.py).

`start` creates it in the running loop, once (a second call while it runs does nothing); `close`
cancels it and waits for it to end, after which `start` may create it again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Optional


class BackgroundTask:
    """`run()` as a task named `name`, started and closed by its owner."""

    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._run = run
        self.name = name
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        """In the event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def close(self) -> None:
        """Cancel the task and wait for it to end (nothing when not started)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
