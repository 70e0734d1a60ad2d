"""A replica's compute lock: closes first, live sessions before offline ones, round robin per chunk.

A session host runs one job at a time (its compute lock). With several sessions streaming, a
dozen chunk steps can be queued on it; a close queued behind them made a client's `reset`
wait for all of them (13 s measured on an H200 with 4 sessions, beyond the client's 5 s
timeout), and kept the closed session's memory counted as long. So each waiter has a class:
`URGENT` (closes, expiry) < `LIVE` (a person watching: the WebSocket's sessions) < `OFFLINE`
(`POST /v1/videos` jobs, issue 46). On release the lock goes to the best waiter: the lowest
class first, so a job's chunk runs only while no live chunk waits, and a job's chunk delays a
live one by at most the job running (the job running is never interrupted; with no live
session a job runs at full speed). Within a class, each waiter has an owner (the session's
routing key) and the lock goes round robin per job: the owner served least recently goes
first (a session that just had a chunk computed waits while another session of its class has
one waiting), arrival order breaking ties. A waiter without an owner counts as never served.
Cancellation is safe at any point: a waiter cancelled after the lock was handed to it passes
it on.
"""
from __future__ import annotations

import asyncio
import itertools
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

URGENT, LIVE, OFFLINE = 0, 1, 2
NORMAL = LIVE  # a call without a session's class
SERVED_MEMORY = 4096  # owners whose last turn is remembered; a forgotten one was served least recently anyway


@dataclass(slots=True)
class _Waiter:
    priority: int
    owner: Optional[str]
    arrival: int
    future: asyncio.Future = field(repr=False)


class PriorityLock:
    def __init__(self) -> None:
        self._locked = False
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()
        # owner -> the turn it was last granted (insertion order = oldest turn first, so the
        # first entries are the ones to forget: dropping them keeps the order of the rest)
        self._served: dict[str, int] = {}
        self._turns = itertools.count()

    def locked(self) -> bool:
        return self._locked

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    async def acquire(self, priority: int = NORMAL, owner: Optional[str] = None) -> None:
        if not self._locked and not self.waiting:
            self._locked = True
            self._granted(owner)
            return
        waiter = _Waiter(priority, owner, next(self._order), asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future  # resolved by release(): the lock is ours (still marked locked)
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():  # handed to us as we were cancelled
                self.release()
            raise
        finally:
            if waiter in self._waiters:  # cancelled while waiting: release() never took it out
                self._waiters.remove(waiter)

    def release(self) -> None:
        if not self._locked:
            raise RuntimeError("release of an unlocked PriorityLock")
        self._waiters = [w for w in self._waiters if not w.future.done()]  # the cancelled
        if not self._waiters:
            self._locked = False
            return
        best = min(self._waiters, key=self._rank)
        self._waiters.remove(best)
        self._granted(best.owner)
        best.future.set_result(None)  # ownership passes on: stays locked

    def _rank(self, w: _Waiter) -> tuple[int, int, int]:
        """Class, then the owner's last turn (never served: -1), then arrival."""
        last = -1 if w.owner is None else self._served.get(w.owner, -1)
        return w.priority, last, w.arrival

    def _granted(self, owner: Optional[str]) -> None:
        if owner is None:
            return
        self._served.pop(owner, None)
        self._served[owner] = next(self._turns)
        if len(self._served) > SERVED_MEMORY:
            del self._served[next(iter(self._served))]

    @asynccontextmanager
    async def hold(self, priority: int, owner: Optional[str] = None) -> AsyncIterator[None]:
        await self.acquire(priority, owner)
        try:
            yield
        finally:
            self.release()

    def urgent(self):
        """`async with lock.urgent():` ahead of every other waiter."""
        return self.hold(URGENT)

    async def __aenter__(self) -> None:
        await self.acquire(NORMAL)

    async def __aexit__(self, *exc: object) -> None:
        self.release()
