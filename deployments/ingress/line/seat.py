"""LineSeats: a connection's side of the waiting room (room.py) for its new live sessions.

A new session's DiT lane job (lane_jobs.py) calls `admit` with its admission (the DiT's
`reserve`): the session joins the line, and while it is not first, or is first but the DiT
answers `busy` (no slot, the frame-rate floor, no bytes), it waits: on the line's next change
(a session ended, someone left or was admitted) or every few seconds, its client told where it
stands (`queued` notices: on a change of place, else every NOTICE_PERIOD_S). Any other answer
(`too_large`, a replica error) ends the wait and is the session's. A session that ends while in
line (reset, replaced, its socket gone: `end`) leaves the line at once; its client may join
again with the notice's `queue_token` within the grace period and takes its old place.

Once admitted, the session holds a seat until it ends: its chunk count goes to the room
(`chunk_done`, the ETAs' measure), and its frames/s to the metrics when it ends.

The room's replica lost (it died; Serve starts another with an empty book): a waiting seat whose
room call fails takes its place again there, in its old order (regain.py); an admitted seat the
room is not told of is forgotten by its successor (it counts nothing there).

Forks, resumed and rebuilt sessions do not queue (they hold or held a place already). An
offline session (a `/v1/videos` job) never queues and is not admitted while live sessions wait:
the place that frees is theirs (its runner retries `busy`).
"""
from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from camera import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES
from deployments.errors import Busy
from deployments.ingress.detached import detach, retrieved, settle
from deployments.ingress.line.book import Place
from deployments.ingress.line.regain import ROOM_LOST_S, Rejoin, regain
from deployments.ingress.stream import Stream
from deployments.log import KeyValueLog
from protocol.messages import Queued

NOTICE_PERIOD_S = 5.0  # a waiting client hears where it stands at least this often
FIRST_NOTICE_S = 0.3  # ... and first once it waited this long (or its admission was refused): arrivals
                      # that meet in an empty line are admitted one after the other, in milliseconds
FIRST_RETRY_S = (0.25, 2.0)  # the first in line tries its admission again within these bounds (busy's hint)
JOB_RETRY_S = 2.0  # a job refused while live sessions wait tries again after this
ROOM_CALL_TIMEOUT_S = 10.0  # a room call not answered by then is given up (the line is bookkeeping)


@dataclass(slots=True)
class _Seat:
    """One session's place: its token (given, or the room's), its ticket, and its chunks."""

    token: Optional[str]
    ticket: Optional[int] = None
    seated: bool = False
    chunks: int = 0
    first_chunk_at: Optional[float] = None
    last_chunk_at: Optional[float] = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    rejoin: Optional[Rejoin] = None  # what its place needs in the room's next replica (regain.py)


class LineSeats:
    """The seats of one connection's sessions (weakly keyed by their streams)."""

    def __init__(self, room: Any, notify: Callable[[Queued], None], log: KeyValueLog,
                 rates: Optional[Callable[[float], None]] = None) -> None:
        """`room`: the WaitingRoom's handle (None: no line, `busy` at once); `notify`: sends a
        notice to the connection's client now; `rates`: takes a seated session's frames/s."""
        self._room = room
        self._notify = notify
        self._log = log
        self._rates = rates
        self._seats: "weakref.WeakKeyDictionary[Stream, _Seat]" = weakref.WeakKeyDictionary()

    def expect(self, stream: Stream, token: Optional[str]) -> None:
        """`stream` is a new live session (its first infer or `drive`, with the client's
        `queue_token` if it sent one): its admission goes through the line."""
        if self._room is not None and not stream.spec.offline:
            self._seats[stream] = _Seat(token)

    def queues(self, stream: Stream) -> bool:
        """Its admission waits in line (a new live session of an application with a line)."""
        s = self._seats.get(stream)
        return s is not None and not s.seated

    async def admit(self, stream: Stream, try_admit: Callable[[], Awaitable[Any]]) -> None:
        """`try_admit()` (the DiT's reservation) once `stream` is first in line, again after
        each `busy` as the line moves; its other errors re-raised. Without a seat: at once."""
        seat = self._seats.get(stream)
        if seat is None or seat.seated:
            if stream.spec.offline and self._room is not None:
                await self._after_the_line()
            await try_admit()
            return
        chunks = None if stream.spec.total_latent_frames is None else (
            stream.spec.total_latent_frames // CHUNK_LATENT_FRAMES)
        try:
            place, version = await self._room.join.remote(stream.spec.owner, chunks, seat.token)
        except Busy:  # the line is full
            raise
        except Exception as e:  # noqa: BLE001 - the room is bookkeeping: without it, admission as before
            self._log.warning("waiting room unreachable: admitted without the line", fields={"error": repr(e)})
            self._seats.pop(stream, None)
            await try_admit()
            return
        seat.ticket, seat.token = place.ticket, place.token
        told: Optional[int] = None
        told_at = joined = time.monotonic()
        seat.rejoin = Rejoin(stream.spec.owner, chunks, place.order, joined)
        refused = False
        retry_s = FIRST_RETRY_S[0]
        try:
            while True:
                if seat.gone.is_set():
                    raise asyncio.CancelledError("the session left the line")
                if place.position == 1:
                    try:
                        await try_admit()
                        break
                    except Busy as e:
                        refused = True
                        retry_s = min(max(e.retry_after_s, FIRST_RETRY_S[0]), FIRST_RETRY_S[1])
                        place = await self._asked(stream, seat, place,
                                                  lambda: self._room.refused.remote(seat.ticket, e.ends_needed))
                due = refused or time.monotonic() - joined >= FIRST_NOTICE_S
                if due and (place.position != told or time.monotonic() - told_at >= NOTICE_PERIOD_S):
                    told, told_at = place.position, time.monotonic()
                    self._notify(Queued(session_id=stream.spec.session_id, position=max(place.position, 1),
                                        eta_s=None if place.eta_s is None else round(place.eta_s, 1),
                                        queue_token=seat.token))
                timeout = retry_s if place.position == 1 else NOTICE_PERIOD_S if told is not None else FIRST_NOTICE_S
                place, version = await self._asked(stream, seat, place,
                                                   lambda: self._room.wait.remote(seat.ticket, version, timeout))
        except BaseException:
            self._leave(seat)
            raise
        if seat.gone.is_set():  # ended while its admission was answered: its close frees the place
            return
        seat.seated = True
        answered, waited = await settle(self._room.seat.remote(seat.ticket), ROOM_CALL_TIMEOUT_S)
        if not answered or isinstance(waited, BaseException):  # admitted all the same (bookkeeping only)
            waited = time.monotonic() - joined
        if told is not None:
            self._log.info("session admitted from the line", fields={"session": stream.key, "waited_s": round(waited, 2)})

    async def _after_the_line(self) -> None:
        """An offline session (a `/v1/videos` job) is not admitted while live sessions wait in
        line: the place that frees is theirs (`Busy`: its runner tries again). A room that does
        not answer holds nothing up."""
        answered, stats = await settle(self._room.stats.remote(), ROOM_CALL_TIMEOUT_S)
        if not answered or isinstance(stats, BaseException):  # bookkeeping only
            return
        if stats.get("waiting", 0) > 0:
            raise Busy(f"{stats['waiting']} live session(s) wait for a place; a video starts once none waits",
                       JOB_RETRY_S)

    async def _asked(self, stream: Stream, seat: _Seat, place: Place, call: Callable[[], Awaitable[Any]]) -> Any:
        """`call()`'s answer (a room call of the waiting `seat`, at `place`). When the room fails
        it (its replica died), the place is taken again in the room's next replica (regain.py)
        and `call()` asked there; `Busy` if the room is not back within ROOM_LOST_S."""
        deadline = None
        while True:
            try:
                return await self._until(seat, call())
            except Exception as e:  # noqa: BLE001 - the room's loss, not the session's
                if deadline is None:
                    deadline = time.monotonic() + ROOM_LOST_S
                    self._log.warning("waiting room lost: the place is taken again in its next replica",
                                      fields={"session": stream.key, "error": repr(e)})
            notice = Queued(session_id=stream.spec.session_id, position=max(place.position, 1), eta_s=None,
                            queue_token=seat.token)
            taken = await regain(self._room, seat.rejoin, seat.token, seat.gone, lambda: self._notify(notice), deadline)
            seat.ticket = taken.ticket

    async def _until(self, seat: _Seat, call: Awaitable[Any]) -> Any:
        """`call`'s answer, or CancelledError once the seat is gone (the call is not cancelled:
        the room answers it by its timeout)."""
        answer = asyncio.ensure_future(call)
        gone = asyncio.ensure_future(seat.gone.wait())
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not answer.done():
            answer.add_done_callback(retrieved)
            raise asyncio.CancelledError("the session left the line")
        return answer.result()

    def chunk_done(self, stream: Stream, step_s: float) -> None:
        """A seated session computed one more chunk, its DiT step `step_s` seconds (the room's
        ETAs learn from it)."""
        seat = self._seats.get(stream)
        if seat is None or not seat.seated:
            return
        now = time.monotonic()
        seat.chunks += 1
        seat.first_chunk_at = seat.first_chunk_at or now
        seat.last_chunk_at = now
        detach(self._call(self._room.progress.remote(seat.ticket, seat.chunks, step_s)), name="line-progress")

    def end(self, stream: Stream) -> None:
        """`stream` ended (reset, replaced, failed, its socket gone): it leaves the line, or
        frees its seat; its frames/s go to the metrics."""
        seat = self._seats.pop(stream, None)
        if seat is None:
            return
        seat.gone.set()
        if seat.seated and self._rates is not None and seat.chunks > 1:
            span = seat.last_chunk_at - seat.first_chunk_at
            if span > 0:
                self._rates((seat.chunks - 1) * CHUNK_VIDEO_FRAMES / span)
        self._leave(seat)

    def _leave(self, seat: _Seat) -> None:
        if seat.ticket is not None:
            ticket, seat.ticket = seat.ticket, None
            detach(self._call(self._room.leave.remote(ticket)), name="line-leave")

    async def _call(self, call: Awaitable[Any]) -> None:
        answered, result = await settle(call, ROOM_CALL_TIMEOUT_S)
        if not answered or isinstance(result, BaseException):  # bookkeeping only: the room's TTL forgets it
            self._log.info("waiting room not told", fields={"error": repr(result) if answered else "timeout"})
