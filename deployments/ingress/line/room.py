"""WaitingRoom: the application's one line (one replica, like the parking), asked by every
ingress replica.

Every call is bookkeeping (book.py) and answers at once, except `wait`: a long poll that
returns when the line changed (someone joined, left, was admitted, a session ended) or after
its timeout, so a connection sends its client a notice when its place moves and the first in
line tries its admission again as soon as a session ends. One summary line per interval, not
one per call.

Its state is the ingress replicas' places: when the replica dies, Serve starts another with an
empty book, and each ingress replica takes its waiting places again there (`rejoin`, regain.py).
A replica's tickets, orders and versions count from its start in microseconds (wall clock), so
they follow its predecessor's: a rejoined place keeps its order ahead of every newcomer, and a
ticket of the replica that died is refused (`TicketOfAnotherRoom`), never taken for another.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Optional

from ray import serve

from deployments.config import SessionArgs
from deployments.errors import Busy
from deployments.ingress.line.book import LineBook, LineFull, Place
from deployments.log import get_log, log_routine_access_at_debug
from deployments.metrics import LineMetrics

SWEEP_PERIOD_S = 5.0
SUMMARY_PERIOD_S = 60.0
MAX_ONGOING = 4096  # long polls of every waiting socket, plus the seats' progress: bookkeeping only


class TicketOfAnotherRoom(LookupError):
    """A ticket of an earlier replica of the room (it died): the seat takes its place again."""


class RoomEvents:
    """A version number and the event of its next change: `wait` returns on any change."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self._changed = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def after(self, version: int, timeout_s: float) -> None:
        if self.version != version:
            return
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class WaitingRoom:
    """The line of sessions waiting for a DiT place (see the module doc and book.py)."""

    def __init__(self, sessions: SessionArgs) -> None:
        log_routine_access_at_debug()  # a CALL line per long poll: DEBUG
        first = time.time_ns() // 1000  # this replica's start (module doc)
        self._book = LineBook(sessions.max_waiting, sessions.resume.grace_s, sessions.idle_ttl_s, first=first,
                              max_per_owner=sessions.max_waiting_per_principal, yield_s=sessions.yield_idle_s)
        self._retry_s = sessions.retry_after_s
        self._events = RoomEvents(first)
        self._log = get_log("line")
        self._metrics = LineMetrics()
        self._summary = {"joined": 0, "rejoined": 0, "admitted": 0, "left": 0, "refused": 0, "longest_wait_s": 0.0}
        self._sweeper = asyncio.get_event_loop().create_task(self._sweep_loop())

    async def join(self, owner: str, chunks: Optional[int], token: Optional[str] = None,
                   rejoin: bool = False) -> tuple[Place, int]:
        """A place in line (`Busy` when the line is full; `rejoin`: a session that yielded its
        seat, never refused), and the line's version with it (for `wait`)."""
        try:
            place = self._book.join(owner, chunks, token, rejoin=rejoin)
        except LineFull as e:
            self._summary["refused"] += 1
            self._metrics.refused.inc()
            raise Busy(f"{e}; try again later", self._retry_s) from None
        self._summary["joined"] += 1
        self._changed()
        return dataclasses.replace(place, order=self._book.order_of(place.ticket)), self._events.version

    async def rejoin(self, owner: str, chunks: Optional[int], token: str, order: float,
                     waited_s: float) -> tuple[Place, int]:
        """A place held in an earlier replica of the room back in line at its order (never
        `Busy`: it was in line already), and the line's version (regain.py)."""
        place = self._book.rejoin(owner, chunks, token, order, waited_s)
        self._summary["rejoined"] += 1
        self._changed()
        return place, self._events.version

    async def wait(self, ticket: int, version: int, timeout_s: float) -> tuple[Place, int]:
        """The ticket's place once the line changed after `version` (or after `timeout_s`), and
        the line's version then."""
        self._own(ticket)
        await self._events.after(version, timeout_s)
        return self._book.place(ticket), self._events.version

    async def seat(self, ticket: int) -> float:
        """The ticket was admitted: it leaves the line; how long it waited."""
        waited = self._book.seat(ticket)
        self._summary["admitted"] += 1
        self._summary["longest_wait_s"] = max(self._summary["longest_wait_s"], waited)
        self._changed()
        return waited

    async def leave(self, ticket: int) -> None:
        """The ticket ends: it leaves the line (its token keeps its place for the grace
        period), or its seated session ended (a place is free)."""
        self._book.end(ticket)
        self._summary["left"] += 1
        self._changed()

    async def refused(self, ticket: int, ends_needed: int) -> Place:
        """The first in line was refused (`Busy.ends_needed`); its place with the ETA that follows."""
        self._own(ticket)
        self._book.refused(ticket, ends_needed)
        return self._book.place(ticket)

    async def progress(self, ticket: int, chunks_done: int, step_s: float) -> None:
        self._book.progress(ticket, chunks_done, step_s)

    async def stats(self) -> dict[str, Any]:
        """For /healthz and /v1/models: the line's length and the seats it knows."""
        return {"waiting": len(self._book), "max_waiting": self._book.max_waiting}

    def _own(self, ticket: int) -> None:
        if ticket < self._book.first:
            raise TicketOfAnotherRoom(f"ticket {ticket} is of an earlier replica of the waiting room")

    def _changed(self) -> None:
        self._events.bump()
        stats = self._book.stats()
        self._metrics.update(stats.waiting, stats.seated, stats.waits_s)

    async def _sweep_loop(self) -> None:
        last_summary = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_PERIOD_S)
            if self._book.sweep():
                self._changed()
            if time.monotonic() - last_summary >= SUMMARY_PERIOD_S:
                last_summary = time.monotonic()
                if self._summary["joined"] or self._summary["rejoined"] or len(self._book):
                    self._log.info("line", fields={**self._summary, "waiting": len(self._book)})
                self._summary = dict.fromkeys(self._summary, 0)
                self._summary["longest_wait_s"] = 0.0
