"""A waiting session's place when the WaitingRoom's replica is lost (issue 54, item 4).

The room (room.py) is one replica: when it dies, Serve starts another with an empty book. The
places live on in the ingress replicas that hold the waiting sockets (seat.py): a room call of a
waiting seat that fails (the replica died under it; or its successor does not know the ticket,
`TicketOfAnotherRoom`) takes the place again in the room's next replica (`WaitingRoom.rejoin`)
with its order in the line and its time in it so far. Orders count from each replica's start
in microseconds (room.py), so the places of the replica that died come back ahead of every place
joined since, in their old order, from whichever ingress replica they rejoin. Meanwhile the
client keeps hearing its last position (`eta_s` null) every NOTICE_PERIOD_S and its session
holds nothing. A room that does not come back within ROOM_LOST_S ends the wait with `busy`
(retryable), never `session_lost`.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from deployments.errors import Busy
from deployments.ingress.detached import detach, settle
from deployments.ingress.line.book import Place

ROOM_LOST_S = 60.0  # a room not back by then ends the wait (`busy`): Serve restarts a replica in seconds
ROOM_RETRY_S = 1.0  # a rejoin that failed (the dead replica still routed to) is asked again after this
LOST_RETRY_AFTER_S = 5.0  # the `busy`'s hint when the room did not come back
NOTICE_PERIOD_S = 5.0  # as seat.py's: the client hears where it stands at least this often
LEAVE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Rejoin:
    """What a place needs to be taken again: its principal, planned chunks (None: open-ended),
    order in the line (the room's join) and when it joined (monotonic)."""

    owner: str
    chunks: Optional[int]
    order: float
    joined: float


async def regain(room: Any, rejoin: Rejoin, token: str, gone: asyncio.Event, notice: Callable[[], None],
                 deadline: float) -> Place:
    """The place taken again in the room's next replica: its new ticket's Place. Asked again
    every ROOM_RETRY_S while the room fails it; `notice()` every NOTICE_PERIOD_S meanwhile;
    CancelledError once `gone` is set, `Busy` past `deadline` (monotonic). A rejoin still on its
    way then is not cancelled: the place it takes is left as soon as it is answered."""
    notices = _Notices(notice)
    gone_wait = asyncio.ensure_future(gone.wait())
    try:
        while True:
            call = asyncio.ensure_future(room.rejoin.remote(rejoin.owner, rejoin.chunks, token, rejoin.order,
                                                            time.monotonic() - rejoin.joined))
            try:
                await _until(call, gone_wait, deadline, notices)
            except BaseException:
                call.add_done_callback(lambda c: _leave_taken(room, c))
                raise
            if not call.cancelled() and call.exception() is None:
                return call.result()[0]
            pause = asyncio.ensure_future(asyncio.sleep(ROOM_RETRY_S))  # the dead replica may still be routed to
            try:
                await _until(pause, gone_wait, deadline, notices)
            finally:
                pause.cancel()
    finally:
        gone_wait.cancel()


class _Notices:
    def __init__(self, notice: Callable[[], None]) -> None:
        self._notice = notice
        self.next_at = time.monotonic() + NOTICE_PERIOD_S

    def due(self, now: float) -> None:
        if now >= self.next_at:
            self.next_at = now + NOTICE_PERIOD_S
            self._notice()


async def _until(waited: asyncio.Future, gone_wait: asyncio.Future, deadline: float, notices: _Notices) -> None:
    """Until `waited` is done, the client told where it stands meanwhile; CancelledError once
    the session left the line, `Busy` past `deadline`."""
    while not waited.done():
        if gone_wait.done():
            raise asyncio.CancelledError("the session left the line")
        now = time.monotonic()
        if now >= deadline:
            raise Busy(f"the waiting room was lost and did not come back within {ROOM_LOST_S:g} s; try again",
                       LOST_RETRY_AFTER_S)
        notices.due(now)
        await asyncio.wait({waited, gone_wait}, timeout=min(deadline, notices.next_at) - now,
                           return_when=asyncio.FIRST_COMPLETED)


def _leave_taken(room: Any, call: asyncio.Future) -> None:
    """A rejoin answered after its seat gave up: the place it took leaves the line."""
    if call.cancelled() or call.exception() is not None:
        return
    place, _ = call.result()
    detach(settle(room.leave.remote(place.ticket), LEAVE_TIMEOUT_S), name="line-leave")
