"""Retention: the ingress replica's timer that sweeps the world store (`worlds.retention_days`).

`Worlds.sweep` deletes every world whose manifest was not updated for the retention time
(deployments/worlds/worlds.py). With `worlds.enabled` and a `retention_days`, each ingress replica
calls it every `worlds.sweep_period_s`, jittered by +-20 % so that replicas started together do
not sweep together (a sweep is idempotent: a world two replicas both find is deleted once, the
other's deletes are no-ops), in a worker thread, and logs one summary line per sweep: the worlds
deleted, the seconds it took. A store that fails is one warning; the next period tries again.
The first sweep comes one jittered period after the replica starts.
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import Callable

from deployments.worlds.background import BackgroundTask
from deployments.worlds.errors import WorldError
from deployments.worlds.worlds import Worlds

JITTER = 0.2  # each period is sweep_period_s times 1 +- this


class RetentionSweeper:
    """Calls `worlds.sweep()` every jittered `period_s` until closed."""

    def __init__(self, worlds: Worlds, period_s: float, log, rand: Callable[[], float] = random.random) -> None:
        self.worlds = worlds
        self.period_s = period_s
        self._log = log
        self._rand = rand
        self._task = BackgroundTask(self._run, "world-retention")  # the loop below (worlds/background.py)
        self.sweeps = self.deleted = self.failures = 0

    def next_wait_s(self) -> float:
        return self.period_s * (1.0 + JITTER * (2.0 * self._rand() - 1.0))

    def start(self) -> None:
        """In the event loop (idempotent)."""
        self._task.start()

    async def close(self) -> None:
        await self._task.close()

    async def sweep_once(self) -> list[str]:
        """One sweep, logged as a summary (the store dirs it deleted; none when the store failed)."""
        t0 = time.perf_counter()
        try:
            gone = await asyncio.to_thread(self.worlds.sweep)
        except WorldError as e:
            self.failures += 1
            self._log.warning("world store retention sweep failed; next period tries again",
                              fields={"error": e.code, "seconds": f"{time.perf_counter() - t0:.2f}"})
            return []
        self.sweeps += 1
        self.deleted += len(gone)
        self._log.info("world store retention sweep", fields={
            "deleted": len(gone), "retention_days": f"{self.worlds.retention_s / 86400.0:g}",
            "seconds": f"{time.perf_counter() - t0:.2f}"})
        return gone

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.next_wait_s())
            try:
                await self.sweep_once()
            except Exception as e:  # noqa: BLE001 - a bug must not stop the timer: logged, next period
                self.failures += 1
                self._log.warning("world store retention sweep failed", fields={"error": type(e).__name__})
