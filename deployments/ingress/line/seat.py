"""LineSeats: a connection's side of the waiting room (room.py) for its new live sessions.

A new session's DiT lane job (lane_jobs.py) calls `admit` with its admission (the DiT's
`reserve`): the session joins the line, and while it is not first, or is first but the DiT
answers `busy` (no slot, the frame-rate floor, no bytes), it waits: on the line's next change
(a session ended, someone left or was admitted) or every few seconds, its client told where it
stands (`queued` notices: on a change of place, else every NOTICE_PERIOD_S). Any other answer
(`too_large`, a replica error) ends the wait and is the session's. A session that ends while in
line (reset, replaced, its socket gone: `end`) leaves the line at once; its client may join
again with the notice's `queue_token` within the grace period and takes its old place. A
join with the token of a place still held by another socket moves the place there: this
socket's session ends with `PlaceMoved` (`session_lost`, saying so).

Once admitted, the session holds a seat until it ends: its chunk count goes to the room
(`chunk_done`, the ETAs' measure), and its frames/s to the metrics when it ends. It yields its
seat to the line (issue 54) while anyone waits:
* idle: no chunk in flight for `sessions.yield_idle_s` (a paused drive is idle; checked every
  WATCH_PERIOD_S): its replicas' state is closed (`retire`), the stream is left without
  replica state (as one the prefix store serves: `served_from_store`) and a `yielded` notice
  goes out after its replies; its next chunk rebuilds it from its journal
  (history/rebuild.py) after waiting its turn in line again (`reserve_dit` with these seats);
* its turn over (`sessions.max_turn_s`, off by default): at its next chunk boundary (the
  chunk's DiT step about to run, `turn_over`) it leaves its seat, its client hears `yielded`
  at once, and the lane job closes its DiT state and rebuilds it once its turn comes again
  (lane_jobs.py; its VAE state stays).
A yielded session's place in line again is never refused (`rejoin`: it was admitted once). A
session without a journal (over `journal_max_mib`, recovery off) cannot be rebuilt: it does
not yield.

The room's replica lost (it died; Serve starts another with an empty book): a waiting seat whose
room call fails takes its place again there, in its old order (regain.py); an admitted seat the
room is not told of is forgotten by its successor (it counts nothing there).

Forks, resumed and rebuilt sessions do not queue (they hold or held a place already), except
a session that yielded its seat while idle and was resumed on a new socket (`rejoin`). An
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
from deployments.errors import Busy, ReplicaError
from deployments.ingress.detached import detach, retrieved, settle
from deployments.ingress.line.book import Place
from deployments.ingress.line.regain import ROOM_LOST_S, Rejoin, regain
from deployments.ingress.stream import Stream, StreamState
from deployments.log import KeyValueLog
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, Queued

NOTICE_PERIOD_S = 5.0  # a waiting client hears where it stands at least this often
FIRST_NOTICE_S = 0.3  # ... and first once it waited this long (or its admission was refused): arrivals
                      # that meet in an empty line are admitted one after the other, in milliseconds
FIRST_RETRY_S = (0.25, 2.0)  # the first in line tries its admission again within these bounds (busy's hint)
JOB_RETRY_S = 2.0  # a job refused while live sessions wait tries again after this
ROOM_CALL_TIMEOUT_S = 10.0  # a room call not answered by then is given up (the line is bookkeeping)
WATCH_PERIOD_S = 1.0  # a seated session's idleness is checked this often


class PlaceMoved(ReplicaError):
    """A join with this session's `queue_token` from another socket took its place in line:
    the session ends here (the place is the other socket's now)."""

    code = ErrorCode.SESSION_LOST


@dataclass(slots=True)
class _Seat:
    """One session's place: its token (given, or the room's), its ticket, and its chunks."""

    token: Optional[str]
    rejoin: bool = False  # it yielded its seat: its place in line again is never refused
    ticket: Optional[int] = None
    seated: bool = False
    chunks: int = 0
    seated_at: Optional[float] = None
    first_chunk_at: Optional[float] = None
    last_chunk_at: Optional[float] = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    regain_as: Optional[Rejoin] = None  # what its place needs in the room's next replica (regain.py)


class LineSeats:
    """The seats of one connection's sessions (weakly keyed by their streams)."""

    def __init__(self, room: Any, notify: Callable[[Queued], None], log: KeyValueLog,
                 rates: Optional[Callable[[float], None]] = None, yield_idle_s: Optional[float] = None,
                 max_turn_s: Optional[float] = None) -> None:
        """`room`: the WaitingRoom's handle (None: no line, `busy` at once); `notify`: sends a
        notice to the connection's client now; `rates`: takes a seated session's frames/s;
        `yield_idle_s`, `max_turn_s`: when a seat yields to the line (None: never; see
        `yields_through`, which turns yielding on)."""
        self._room = room
        self._notify = notify
        self._log = log
        self._rates = rates
        self._yield_idle_s = yield_idle_s
        self._max_turn_s = max_turn_s
        self._retire: Optional[Callable[[str, str], None]] = None
        self._tell: Optional[Callable[[ErrorReply, Stream], None]] = None
        self._seats: "weakref.WeakKeyDictionary[Stream, _Seat]" = weakref.WeakKeyDictionary()

    def yields_through(self, retire: Callable[[str, str], None], tell: Callable[[ErrorReply, Stream], None]) -> None:
        """Seats yield to the line (`yield_idle_s`): `retire(dit_key, vae_key)` closes a
        yielding session's keys on the replicas (releases.py), `tell(notice, stream)` sends its
        `yielded` notice after its replies."""
        self._retire, self._tell = retire, tell

    def expect(self, stream: Stream, token: Optional[str]) -> None:
        """`stream` is a new live session (its first infer or `drive`, with the client's
        `queue_token` if it sent one): its admission goes through the line."""
        if self._room is not None and not stream.spec.offline:
            self._seats[stream] = _Seat(token)

    def rejoin(self, stream: Stream) -> None:
        """`stream` was resumed on this socket with no replica holding it (it yielded its seat
        before its socket dropped): its next admission (its rebuild's) waits in line again."""
        if self._room is not None and not stream.spec.offline:
            self._seats[stream] = _Seat(None, rejoin=True)

    def yielded(self, stream: Stream) -> bool:
        """`stream` gave its seat to the line while idle and has not had it back: no replica
        holds it (one whose turn ended mid-stream keeps its VAE state: not this)."""
        s = self._seats.get(stream)
        return s is not None and s.rejoin and not s.seated and not stream.materialised

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
        chunks = None if stream.spec.total_latent_frames is None else (  # left: a yielded one made some
            stream.spec.total_latent_frames // CHUNK_LATENT_FRAMES - len(stream.journal.chunks))
        try:
            place, version = await self._room.join.remote(stream.spec.owner, chunks, seat.token, seat.rejoin)
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
        seat.regain_as = Rejoin(stream.spec.owner, chunks, place.order, joined)
        refused = False
        retry_s = FIRST_RETRY_S[0]
        try:
            while True:
                if seat.gone.is_set():
                    raise asyncio.CancelledError("the session left the line")
                if place.moved:
                    raise PlaceMoved("another connection sent this session's queue_token and took its place in "
                                     "line: the session ends on this connection")
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
                if due and place.position >= 1 and (place.position != told
                                                    or time.monotonic() - told_at >= NOTICE_PERIOD_S):
                    told, told_at = place.position, time.monotonic()
                    self._notify(Queued(session_id=stream.spec.session_id, position=place.position,
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
        seat.seated, seat.seated_at = True, time.monotonic()
        answered, waited = await settle(self._room.seat.remote(seat.ticket), ROOM_CALL_TIMEOUT_S)
        if not answered or isinstance(waited, BaseException):  # admitted all the same (bookkeeping only)
            waited = time.monotonic() - joined
        if told is not None:
            self._log.info("session admitted from the line", fields={"session": stream.key, "waited_s": round(waited, 2)})
        if self._retire is not None and self._yield_idle_s is not None:
            detach(self._watch(weakref.ref(stream), seat), name="line-yield")

    async def _after_the_line(self) -> None:
        """An offline session (a `/v1/videos` job) is not admitted while live sessions wait in
        line: the place that frees is theirs (`Busy`: its runner tries again). A room that does
        not answer holds nothing up."""
        waiting = await self._waiting()
        if waiting > 0:
            raise Busy(f"{waiting} live session(s) wait for a place; a video starts once none waits", JOB_RETRY_S)

    async def _waiting(self) -> int:
        """How many sessions wait in the room's line; 0 when the room does not answer in time
        (bookkeeping only: a room that does not answer holds nothing up)."""
        answered, stats = await settle(self._room.stats.remote(), ROOM_CALL_TIMEOUT_S)
        if not answered or isinstance(stats, BaseException):
            return 0
        return int(stats.get("waiting", 0))

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
            taken = await regain(self._room, seat.regain_as, seat.token, seat.gone, lambda: self._notify(notice), deadline)
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

    async def _watch(self, ref: "weakref.ref[Stream]", seat: _Seat) -> None:
        """While the session holds its seat: once it had no chunk in flight for yield_idle_s
        and anyone waits, it yields (`max_turn_s`: `turn_over`, at a chunk boundary)."""
        idle_since: Optional[float] = None
        seen: Optional[tuple] = None
        while seat.seated and not seat.gone.is_set():
            try:
                await asyncio.wait_for(seat.gone.wait(), WATCH_PERIOD_S)
                return
            except asyncio.TimeoutError:
                pass
            stream, now = ref(), time.monotonic()
            if stream is None or self._seats.get(stream) is not seat:
                return
            state, seen = seen, _activity(stream)
            if state != seen or not _idle(stream):  # a chunk, a rewind or a rebuild since the last look
                idle_since = None
                continue
            idle_since = idle_since or now
            if now - idle_since < self._yield_idle_s or not stream.journal.recoverable or not stream.journal.chunks:
                continue
            if not await self._waiting():
                continue
            if self._seats.get(stream) is seat and seat.seated and _idle(stream) and _activity(stream) == seen:
                self._yield(stream, seat, f"idle for {now - idle_since:.0f} s")
                return

    async def turn_over(self, stream: Stream) -> bool:
        """At a chunk boundary (its DiT step about to run): True when the seated `stream` held
        its seat `max_turn_s` while anyone waits. It then leaves its seat (the line moves, its
        client hears `yielded`) and waits in line again: the caller closes its DiT state and
        rebuilds it through `reserve_dit` with these seats (lane_jobs.py)."""
        seat = self._seats.get(stream)
        if (seat is None or not seat.seated or self._max_turn_s is None or self._room is None
                or time.monotonic() - seat.seated_at < self._max_turn_s
                or not stream.journal.recoverable or not stream.journal.chunks):
            return False
        if not await self._waiting():
            return False
        if self._seats.get(stream) is not seat or not seat.seated:
            return False
        held = time.monotonic() - seat.seated_at
        self._seats[stream] = _Seat(None, rejoin=True)
        self._free(seat)
        self._log.info("session yielded its seat to the line", fields={"session": stream.key, "why": "turn",
                                                                       "held_s": round(held, 1)})
        self._notify(ErrorReply(code=ErrorCode.YIELDED, session_id=stream.spec.session_id, message=(
            f"the session held its place {held:.0f} s (sessions.max_turn_s) while others wait: its next chunk "
            "waits in line, then the session goes on")))
        return True

    def _yield(self, stream: Stream, seat: _Seat, why: str) -> None:
        """The seat goes to the line: the session's replica state is closed, its stream keeps
        its journal (no replica state: its next chunk rebuilds it after its turn in line), its
        client told (`yielded`)."""
        self._retire(stream.dit_key, stream.vae_key)
        stream.new_key("dit")
        stream.new_key("vae")
        stream.served_from_store()  # no replica holds it: its next chunk materialises it (prefix/reuse.py)
        self._seats[stream] = _Seat(None, rejoin=True)  # its next admission waits in line
        self._free(seat)
        self._log.info("session yielded its seat to the line", fields={"session": stream.key, "why": why})
        self._tell(ErrorReply(code=ErrorCode.YIELDED, session_id=stream.spec.session_id, message=(
            f"the session gave its place to the sessions waiting ({why} while others wait); it is kept: its next "
            "infer (or drive) waits in line and then continues it")), stream)

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
        if seat is not None:
            self._free(seat)

    def _free(self, seat: _Seat) -> None:
        """The seat ends (its session ended, or yielded): it leaves the line or frees its place;
        a seated session's frames/s go to the metrics."""
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


def _activity(stream: Stream) -> tuple:
    """What changes when the session does anything: its chunk count and keys (a rewind, a rebuild)."""
    return stream.next_chunk, stream.dit_key, stream.vae_key, len(stream.chunk_tasks)


def _idle(stream: Stream) -> bool:
    """Open, held by its replicas, no chunk in flight and no open or rebuild on its way."""
    return (stream.state is StreamState.OPEN and stream.materialised
            and not any(not t.done() for t in stream.chunk_tasks)
            and all(f is None or f.done() for f in (stream.dit_open, stream.vae_open)))
