"""LineBook: the waiting room's bookkeeping, first come first served (no Ray, no asyncio).

A new live session joins the line before its admission (`join`); only the first in line tries
the DiT's admission, so a place that frees goes to whoever waited longest, whichever ingress
replica holds its socket. Positions count from 1 (the first in line).

A place in line is a *ticket* (one join of one socket) of a *token* (what the client is told in
its `queued` notices). A ticket that leaves the line frees its place at once (everyone behind
moves up); when it left without being admitted (its socket dropped), its token is remembered
for `grace_s`, and a join with that token within it takes the token's old place again (its
order in the line: a client that reconnects is not sent to the back). A join with the token of
a ticket still waiting moves the place to the new ticket: the old one is told (`Place.moved`).
One owner (the API key, the address without auth) holds at most `max_per_owner` places.

ETAs come from the sessions the room saw admitted (`seat`) and the places they hold, as
processor sharing: the DiT's work is compute-bound and its replica computes its live sessions'
chunks in turn, so N running sessions each advance at 1/N of the replica's speed. The step
(one chunk of one session alone) is measured twice per chunk of a seat, and the larger taken:
the DiT's own measure (the chunk's `dit` stage: the bound where the DiT is the bottleneck, as
on a GPU), and the time since the seat's previous chunk over the seats streaming then (those
with a chunk computed: a session still starting is not sharing the DiT yet), which holds where
other stages bound the rate (the VAE, the client's pace). A seat's remaining work is its chunks
left (planned minus done) times the step; an open-ended one's, the mean length of the
open-ended sessions that ended minus its age; one past that is expected to run as long again as
it overran (re-estimated as it goes on, never a fixed floor repeated). With `yield_s` (the seats
yield to the line when idle that long, issue 54), a seat that looks idle (no chunk for
IDLE_STEPS of its turns) frees at most `yield_s` after its last chunk.

The places (how many sessions run at once) are learned: at least as many as were ever seated
together; when the first in line is refused, as many as the refusing replica says fit
(`Busy.ends_needed`: with the frame-rate floor, sessions that ran together may no longer fit
once their steps were measured slower). The line is played forward: while the running sessions
take every place, the one with the least work left ends; the first in line then takes a free
place with its own work (its chunks times the step), and so on.
"""
from __future__ import annotations

import hashlib
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

TOKEN_BYTES = 18  # 144 bits, url-safe base64: 24 characters
DEFAULT_CHUNK_S = 2.0  # the chunk interval assumed before any session reported one
DEFAULT_OPEN_ENDED_S = 120.0  # an open-ended session's length before one ended
EWMA = 0.3  # weight of the newest sample in the interval and length estimates
MIN_REMAINING_S = 0.5  # a running session past its expected end is expected to end soon, not in the past
FORGOTTEN_TOKENS = 4096  # tokens of tickets that left, kept for their grace period (FIFO beyond this)
IDLE_STEPS = 3.0  # a seat with no chunk for this many of its turns (step x streaming seats) looks idle
YIELD_SLACK_S = 2.0  # an idle seat's yield is seen within this of `yield_s` (the ingress checks every second)


class LineFull(Exception):
    """The line holds `max_waiting` sessions already, or its owner `max_per_owner` places."""


@dataclass(frozen=True, slots=True)
class Place:
    """Where a ticket stands: `position` 1 is first in line (0: not in line any more)."""

    ticket: int
    token: str
    position: int
    eta_s: Optional[float]
    order: float = 0.0  # the ticket's order in the line (the room's join sets it: a rejoin keeps it, regain.py)
    moved: bool = False  # its place went to a newer ticket of the same token (another socket)


@dataclass(slots=True)
class _Waiting:
    order: float  # the token's order in the line (its first join)
    token_digest: str
    owner: str
    chunks: Optional[int]  # planned chunks (None: open-ended)
    joined: float


@dataclass(slots=True)
class _Seat:
    """A session the room saw admitted, until it ends."""

    chunks: Optional[int]
    started: float
    last_seen: float
    done: int = 0  # chunks computed


@dataclass(slots=True)
class _Left:
    order: float
    owner: str
    until: float


@dataclass
class LineStats:
    waiting: int
    seated: int
    admitted_total: int
    step_s: float  # one chunk of one session alone, as measured (DEFAULT_CHUNK_S before any)
    waits_s: list[float] = field(default_factory=list)  # waits of the admissions since the last call


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LineBook:
    """One line, its seats and the estimates behind its ETAs."""

    def __init__(self, max_waiting: int, grace_s: float, seat_ttl_s: float,
                 clock: Callable[[], float] = time.monotonic, first: int = 1, *,
                 max_per_owner: Optional[int] = None, yield_s: Optional[float] = None) -> None:
        """`max_waiting`: the line's length; `grace_s`: how long a ticket that left keeps its
        token's place; `seat_ttl_s`: a seat not heard of this long is dropped (its connection's
        end was not told); `first`: the first ticket and order (the room's replica: its start
        in microseconds, so that a replica's tickets and orders follow its predecessor's);
        `max_per_owner`: places one owner holds (None: no cap); `yield_s`: an idle seat yields
        this long after its last chunk (None: seats do not yield)."""
        self.first = first
        self._max = max_waiting
        self._max_per_owner = max_per_owner
        self._yield_s = yield_s
        self._moved: OrderedDict[int, None] = OrderedDict()  # tickets whose place moved (told once asked)
        self._grace_s = grace_s
        self._seat_ttl_s = seat_ttl_s
        self._clock = clock
        self._tickets = itertools.count(first)
        self._order = itertools.count(first)
        self._waiting: dict[int, _Waiting] = {}  # ticket -> entry
        self._seats: dict[int, _Seat] = {}  # ticket -> admitted session
        self._left: OrderedDict[str, _Left] = OrderedDict()  # token digest -> its place, for grace_s
        self._step_s: Optional[float] = None  # one chunk of one session alone (the DiT's step)
        self._open_ended_s: Optional[float] = None
        self._admitted_total = 0
        self._waits: list[float] = []
        self._places = 0  # sessions running at once, as learned (module doc)

    # ---- the line ----

    def join(self, owner: str, chunks: Optional[int], token: Optional[str] = None, rejoin: bool = False) -> Place:
        """A new ticket in line (`LineFull` beyond max_waiting or its owner's max_per_owner;
        `rejoin`: a session that yielded its seat, at the back and never refused: it was
        admitted once, and refusing it would lose it). `token` of a ticket that left within its
        grace period (and of the same `owner`) takes that ticket's place again; of a ticket
        still waiting, moves its place to the new ticket (the same client on a new socket)."""
        now = self._clock()
        self._forget_expired(now)
        order = None
        if token is not None:
            digest = _digest(token)
            left = self._left.get(digest)
            if left is not None and left.owner == owner:
                del self._left[digest]
                order = left.order
            for ticket, w in list(self._waiting.items()):
                if w.token_digest == digest and w.owner == owner:
                    order = w.order
                    del self._waiting[ticket]
                    self._moved[ticket] = None
                    while len(self._moved) > FORGOTTEN_TOKENS:
                        self._moved.popitem(last=False)
        if order is None and not rejoin:
            if len(self._waiting) >= self._max:
                raise LineFull(f"the waiting room is full ({self._max} sessions wait)")
            held = sum(1 for w in self._waiting.values() if w.owner == owner)
            if self._max_per_owner is not None and held >= self._max_per_owner:
                raise LineFull(f"this client holds {held} places in the line already, the most one client may "
                               f"(sessions.max_waiting_per_principal: {self._max_per_owner})")
        if order is None:
            token, order = secrets.token_urlsafe(TOKEN_BYTES), float(next(self._order))
        ticket = next(self._tickets)
        self._waiting[ticket] = _Waiting(order, _digest(token), owner, chunks, now)
        return self.place(ticket, token)

    def place(self, ticket: int, token: str = "") -> Place:
        """Where `ticket` stands now (position 0: no longer waiting)."""
        line = self._line()
        if ticket not in self._waiting:
            return Place(ticket, token, 0, None, moved=ticket in self._moved)
        position = line.index(ticket) + 1
        return Place(ticket, token, position, self._etas(line)[position - 1])

    def position(self, ticket: int) -> int:
        return self.place(ticket).position

    def leave(self, ticket: int) -> None:
        """The ticket leaves the line without a place (its socket ended, its session was
        closed or refused): its token keeps its order for the grace period."""
        self._moved.pop(ticket, None)
        w = self._waiting.pop(ticket, None)
        if w is None:
            return
        now = self._clock()
        self._left[w.token_digest] = _Left(w.order, w.owner, now + self._grace_s)
        self._left.move_to_end(w.token_digest)
        while len(self._left) > FORGOTTEN_TOKENS:
            self._left.popitem(last=False)

    def seat(self, ticket: int) -> float:
        """The first in line was admitted: it leaves the line and holds a seat; its wait (s)."""
        now = self._clock()
        w = self._waiting.pop(ticket, None)  # None: it left meanwhile (admitted all the same)
        chunks, joined = (None, now) if w is None else (w.chunks, w.joined)
        self._seats[ticket] = _Seat(chunks, now, now)
        self._places = max(self._places, len(self._seats))
        self._admitted_total += 1
        waited = now - joined
        self._waits.append(waited)
        return waited

    # ---- the seats ----

    def refused(self, ticket: int, ends_needed: int) -> None:
        """The first in line was refused: `ends_needed` of the running sessions must end before
        it fits (its replica's answer), so the places are fewer than the seats plus one. With no
        seat known, the sessions holding the places are not the room's (forks, resumes, rebuilds):
        no ETA then."""
        line = self._line()
        if line and line[0] == ticket:
            self._places = max(len(self._seats) + 1 - ends_needed, 1) if self._seats else 0

    def progress(self, ticket: int, chunks_done: int, step_s: float) -> None:
        """A seated session computed `chunks_done` chunks, the last one's DiT step `step_s`
        seconds (its compute, not its wait): its work left, and a sample of the step (module doc)."""
        s = self._seats.get(ticket)
        if s is None or chunks_done <= s.done:
            return
        now = self._clock()
        samples = [step_s]
        if s.done >= 1:  # the first chunk's wait includes the session's start (encodes): not a step
            streaming = sum(1 for x in self._seats.values() if x.done >= 1)
            samples.append((now - s.last_seen) / (chunks_done - s.done) / streaming)
        samples = [x for x in samples if x > 0]  # none measured (a fake's timings, the same instant)
        if samples:
            step = max(samples)
            self._step_s = step if self._step_s is None else (1 - EWMA) * self._step_s + EWMA * step
        s.done, s.last_seen = chunks_done, now

    def end(self, ticket: int) -> bool:
        """A seated session ended (True) — or a waiting ticket left (`leave`, False)."""
        s = self._seats.pop(ticket, None)
        if s is None:
            self.leave(ticket)
            return False
        if s.chunks is None:
            length = self._clock() - s.started
            self._open_ended_s = length if self._open_ended_s is None else (
                (1 - EWMA) * self._open_ended_s + EWMA * length)
        return True

    def sweep(self) -> list[int]:
        """Drop the seats not heard of for seat_ttl_s and the expired tokens; the dropped seats."""
        now = self._clock()
        self._forget_expired(now)
        stale = [t for t, s in self._seats.items() if now - s.last_seen > self._seat_ttl_s]
        for t in stale:
            del self._seats[t]
        return stale

    def stats(self) -> LineStats:
        waits, self._waits = self._waits, []
        return LineStats(len(self._waiting), len(self._seats), self._admitted_total,
                         self._step_s or DEFAULT_CHUNK_S, waits)

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def max_waiting(self) -> int:
        return self._max

    # ---- a replica of the room lost (regain.py) ----

    def rejoin(self, owner: str, chunks: Optional[int], token: str, order: float, waited_s: float) -> Place:
        """A place held in an earlier replica of the room (it died, regain.py) back in line at
        its `order`, waiting since `waited_s` ago; never `LineFull` (it was in line already). A
        ticket of the same token still waiting is replaced (a rejoin asked twice)."""
        digest = _digest(token)
        self._left.pop(digest, None)
        for ticket, w in list(self._waiting.items()):
            if w.token_digest == digest:
                del self._waiting[ticket]
        ticket = next(self._tickets)
        self._waiting[ticket] = _Waiting(order, digest, owner, chunks, self._clock() - max(waited_s, 0.0))
        return self.place(ticket, token)

    def order_of(self, ticket: int) -> float:
        """A waiting ticket's order in the line (0.0: not waiting)."""
        w = self._waiting.get(ticket)
        return 0.0 if w is None else w.order

    # ---- estimates ----

    def _line(self) -> list[int]:
        return sorted(self._waiting, key=lambda t: self._waiting[t].order)

    def _work(self, chunks: Optional[int]) -> float:
        """A waiting session's work: seconds of the replica alone."""
        step = self._step_s or DEFAULT_CHUNK_S
        if chunks is not None:
            return chunks * step
        return self._open_ended_s / max(len(self._seats), 1) if self._open_ended_s else DEFAULT_OPEN_ENDED_S

    def _left_work(self, s: _Seat, now: float) -> float:
        """A running session's work left (seconds of the replica alone), at least a step's
        worth of MIN_REMAINING_S. One past its expected end is expected to run as long again as
        it overran (module doc); an idle one (no chunk for IDLE_STEPS turns) yields at most
        `yield_s` (plus YIELD_SLACK_S) after its last chunk."""
        step = self._step_s or DEFAULT_CHUNK_S
        n = max(len(self._seats), 1)
        if s.chunks is not None:
            left = (s.chunks - s.done) * step
        else:
            length = self._open_ended_s or DEFAULT_OPEN_ENDED_S
            left = (s.started + length - now) / n
            if left < 0:  # past its expected end: re-estimated from its overrun
                left = -left
        if self._yield_s is not None and now - s.last_seen > IDLE_STEPS * step * n:
            left = min(left, max(s.last_seen + self._yield_s + YIELD_SLACK_S - now, 0.0) / n)
        return max(left, MIN_REMAINING_S / n)

    def _etas(self, line: list[int]) -> list[Optional[float]]:
        """Each waiting ticket's expected wait, the line played forward as processor sharing
        over the seats' work left in the places learned (see the module doc); None for all
        before any session was seated."""
        if not self._places:
            return [None] * len(line)
        now = self._clock()
        active = [self._left_work(s, now) for s in self._seats.values()]
        t, etas = 0.0, []
        for ticket in line:
            while active and len(active) >= self._places:
                least = min(active)
                t += least * len(active)  # every running session advanced by `least` at 1/len(active) speed
                active = [w - least for w in active]
                active.remove(min(active))
            etas.append(t)
            active.append(self._work(self._waiting[ticket].chunks))
        return etas

    def _forget_expired(self, now: float) -> None:
        while self._left and next(iter(self._left.values())).until <= now:
            self._left.popitem(last=False)
