"""The sessions one replica holds: admission, lookup, idle expiry, and when a slot frees.

Used by the DiT and VAE deployments alike. The table is authoritative: a call for a key
it does not hold raises `SessionLost`; nothing is ever restarted silently.

Admission may come before any work for a session (`admit(reserve_only=True)`): the slot and
bytes are held for the open that follows (`claim`), and a reservation never claimed expires
like an idle session. `retry_hint` is the `retry_after_s` of a `busy`: the soonest a held slot
is expected to free. A session whose holder said when it will be closed (a parked session: its
grace end, `expect_release`) frees then; one whose end is unknown (in use, idle between its
client's chunks, an open on its way) counts as the configured `retry_after_s` (the poll
interval), or its idle TTL's end when sooner. So a replica full of parked sessions answers
with the end of the soonest grace period, not a poll interval that would find it still full.

Each session has a class (issue 46): live (a person watching) or offline (a `/v1/videos` job).
With `max_offline_sessions` set (the DiT's), offline sessions count against it and live ones
against `max_sessions`, apart; without (the VAE's), all count against `max_sessions`. Bytes
count all together. Its class and its `bucket` (what the DiT's frame-rate floor groups step
times by, replicas/frame_floor.py) are kept for the host's compute lock and admission.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

from deployments.errors import Busy, SessionLost, TooLarge
from deployments.replicas.snapshots import SnapshotShelf

S = TypeVar("S")

CLOSED_MEMORY_S = 900.0  # closed keys remembered (a late open of one is refused), at least the pin TTL
CLOSED_MEMORY_MAX = 65536  # ... and at most this many (the oldest are forgotten first)
MIN_RETRY_S = 0.5  # the least retry_after_s a busy carries (a slot due now may take a sweep to free)


@dataclass(slots=True)
class _Entry(Generic[S]):
    state: Optional[S]  # None while the session is being opened
    nbytes: int  # held between calls
    last_used: float
    active: int = 0  # calls in progress; a session in use never expires
    building: bool = False  # the open is building the state (it left the queue for the lock)
    closing: bool = False  # closed while it was being built: the open frees what it built
    working: int = 0  # needed on top while one of its calls runs (one call at a time per replica)
    reserved: bool = False  # admitted before any work, its open not yet arrived (`claim`)
    release_at: Optional[float] = None  # when its holder said it will be closed (a parked session's grace end)
    offline: bool = False  # a `/v1/videos` job's session (`SessionOptions.offline`)
    bucket: Optional[Hashable] = None  # its step-time bucket (the DiT's frame-rate floor)


class SessionTable(Generic[S]):
    """Admission control (count and bytes) plus idle TTL over per-session states.

    Bytes: each session holds `nbytes` between calls and needs `working` more while one of its
    calls runs; calls run one at a time per replica, so the budget must cover the sum of the
    held bytes plus the largest working set. A session that cannot fit even an empty replica
    gets `TooLarge`; one that does not fit now gets `Busy`.
    """

    def __init__(
        self,
        max_sessions: int,
        budget_bytes: Optional[int],
        idle_ttl_s: float,
        retry_after_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_offline_sessions: Optional[int] = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self.max_offline_sessions = max_offline_sessions  # None: offline sessions take live slots
        self.budget_bytes = budget_bytes
        self.idle_ttl_s = idle_ttl_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._entries: dict[str, _Entry[S]] = {}
        self._retiring_bytes = 0  # of sessions closed whose state is not released yet
        # Keys closed on this replica -> when. Keys are unique per incarnation and never reused,
        # so an open that arrives after its session's close (the client left while the open was
        # still on its way) is refused instead of holding a slot nobody will ever close.
        self._closed: dict[str, float] = {}
        # The replica's snapshots (snapshots.py): they live in the budget's spare bytes and give
        # way to sessions (`_make_room`); never counted in `bytes_in_use` (nor in the load).
        self.snapshots: SnapshotShelf = SnapshotShelf(0)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        """Keys held, reservations of opens in progress included."""
        return list(self._entries)

    @property
    def bytes_in_use(self) -> int:
        return sum(e.nbytes for e in self._entries.values()) + self._retiring_bytes

    @property
    def working_bytes(self) -> int:
        """The largest working set of the sessions held (what one running call may add)."""
        return max((e.working for e in self._entries.values()), default=0)

    @property
    def reserved_bytes(self) -> int:
        """Held bytes plus the largest working set: what admission compares with the budget."""
        return self.bytes_in_use + self.working_bytes

    @property
    def free_slots(self) -> int:
        """Slots of `max_sessions` free (offline sessions counted apart take none)."""
        return self.max_sessions - self._count(offline=False)

    def _apart(self, entry: _Entry) -> bool:
        """`entry` counts against `max_offline_sessions`, not `max_sessions`."""
        return entry.offline and self.max_offline_sessions is not None

    def _count(self, offline: bool) -> int:
        """Sessions counted against `max_offline_sessions` (`offline`), or against `max_sessions`."""
        return sum(1 for e in self._entries.values() if self._apart(e) == offline)

    def apart_keys(self) -> list[str]:
        """Sessions counted against `max_offline_sessions`, not `max_sessions` (the router's stats)."""
        return [k for k, e in self._entries.items() if self._apart(e)]

    def held_by_class(self) -> tuple[int, int]:
        """(live, offline) sessions held, reservations included (metrics)."""
        offline = sum(1 for e in self._entries.values() if e.offline)
        return len(self._entries) - offline, offline

    def is_offline(self, key: str) -> bool:
        """Whether `key` is an offline session (False when not held)."""
        entry = self._entries.get(key)
        return entry is not None and entry.offline

    def bucket(self, key: str) -> Optional[Hashable]:
        """The step-time bucket `key` was admitted with (None when not held or none)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.bucket

    def live_buckets(self) -> list[Optional[Hashable]]:
        """The bucket of every live session held (reservations and opens in progress included),
        but a parked one (`expect_release`: it streams nothing until claimed, issue 54)."""
        return [e.bucket for e in self._entries.values() if not e.offline and e.release_at is None]

    def admit(self, key: str, nbytes: int, working: int = 0, reserve_only: bool = False, offline: bool = False,
              bucket: Optional[Hashable] = None) -> None:
        """Reserve a slot and `nbytes` (+ `working` while it computes) for a new session, or
        raise `Busy` (no room now) or `TooLarge` (no room ever).

        The reservation counts at once, so concurrent opens cannot overbook the replica;
        `add` fills it in, `pop` gives it back when the open fails. `reserve_only`: admission
        ahead of the open (nothing is built yet): the open `claim`s it; unclaimed, it expires
        after the idle TTL. `offline`, `bucket`: its class and step-time bucket (module doc).
        """
        assert key not in self._entries, f"session {key} is already open"
        self._forget_closed()
        if key in self._closed:
            raise SessionLost("this session was closed (its client left or reset it); start a new one")
        if self.budget_bytes is not None and nbytes + working > self.budget_bytes:
            raise TooLarge(
                f"the session needs {(nbytes + working) / 2**30:.2f} GiB ({nbytes / 2**30:.2f} held: caches, "
                f"noise plan, text; {working / 2**30:.2f} while a chunk runs) and the replica's whole session "
                f"budget is {self.budget_bytes / 2**30:.2f} GiB; ask for a smaller size or fewer frames"
            )
        if offline and self.max_offline_sessions is not None:
            if self._count(offline=True) >= self.max_offline_sessions:
                retry = self.retry_hint()
                raise Busy(f"all {self.max_offline_sessions} offline (/v1/videos) session slots of this replica "
                           f"are taken (sessions.max_offline_sessions); retry in {retry:g} s", retry)
        elif self._count(offline=False) >= self.max_sessions:
            retry = self.retry_hint()
            raise Busy(f"all {self.max_sessions} session slots of this replica are taken; retry in {retry:g} s",
                       retry)
        # snapshots being copied from count: the copy needs room beside them
        if self.budget_bytes is not None and (self.bytes_in_use + self.snapshots.held_bytes + nbytes
                                              + max(self.working_bytes, working) > self.budget_bytes):
            retry = self.retry_hint()
            raise Busy(
                f"the session's memory ({(nbytes + working) / 2**20:.1f} MiB) does not fit the free "
                f"session budget ({(self.budget_bytes - self.reserved_bytes) / 2**20:.1f} MiB); "
                f"retry in {retry:g} s or ask for fewer frames",
                retry,
            )
        self._make_room(nbytes + max(self.working_bytes, working))
        # opening: never expires; reserved ahead of its open: expires unclaimed
        self._entries[key] = _Entry(None, nbytes, self._clock(), active=0 if reserve_only else 1, working=working,
                                    reserved=reserve_only, offline=offline, bucket=bucket)

    def claim(self, key: str) -> bool:
        """The open of `key` takes the reservation `admit(reserve_only=True)` made for it;
        False when there is none (never made, expired, or closed): the open admits itself."""
        entry = self._entries.get(key)
        if entry is None or not entry.reserved:
            return False
        entry.reserved = False
        entry.active = 1  # opening: never expires
        entry.last_used = self._clock()
        return True

    def expect_release(self, key: str, within_s: float) -> bool:
        """Its holder says `key` will be closed within `within_s` unless it is used again (a
        parked session: its grace period); the next call of `key` forgets it. False when absent."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        entry.release_at = self._clock() + within_s
        return True

    def retry_hint(self) -> float:
        """When a slot or its bytes is expected to free (see the module doc), in seconds."""
        now = self._clock()
        soonest = []
        for e in self._entries.values():
            if e.release_at is not None:
                soonest.append(e.release_at - now)
            elif e.active == 0 and e.state is not None:  # idle: its TTL frees it, unless its client goes on
                soonest.append(min(e.last_used + self.idle_ttl_s - now, self.retry_after_s))
            else:  # in use, or an open on its way: its end is unknown
                soonest.append(self.retry_after_s)
        if self._retiring_bytes:  # closed, its call still running: its bytes free when that call ends
            soonest.append(self.retry_after_s)
        return math.ceil(10 * max(MIN_RETRY_S, min(soonest, default=self.retry_after_s))) / 10  # never early

    def start_building(self, key: str) -> bool:
        """The open of `key` got its turn; False when it was closed while it queued (the
        reservation is already given back: build nothing)."""
        entry = self._entries.get(key)
        if entry is None or entry.state is not None:
            return False
        entry.building = True
        return True

    def add(self, key: str, state: S) -> bool:
        """Fill in the reservation made by `admit` with the opened session's state.

        False when the session was closed while it was being opened: the reservation is given
        back and the caller frees `state` (nobody will ever close it again)."""
        entry = self._entries.get(key)
        if entry is None or entry.closing:
            self._entries.pop(key, None)
            return False
        assert entry.state is None, f"session {key} is already open"
        entry.state = state
        entry.active -= 1
        entry.last_used = self._clock()
        return True

    def resize(self, key: str, nbytes: int) -> bool:
        """Change a held session's reservation; False (unchanged) when it would exceed the budget."""
        entry = self._entries[key]
        if self.budget_bytes is not None and (self.bytes_in_use + self.snapshots.held_bytes - entry.nbytes + nbytes
                                              + self.working_bytes > self.budget_bytes):
            return False
        self._make_room(nbytes - entry.nbytes + self.working_bytes)
        entry.nbytes = nbytes
        return True

    def room_for_snapshot(self, nbytes: int) -> bool:
        """Whether a snapshot of `nbytes` fits beside the sessions (their held bytes and the
        largest working set) and the snapshots kept, the oldest of those evicted for it."""
        if self.budget_bytes is None:
            return True
        self._make_room(nbytes + self.working_bytes)
        return self.reserved_bytes + self.snapshots.nbytes + nbytes <= self.budget_bytes

    def _make_room(self, needed: int) -> None:
        """Evict snapshots so that `needed` more bytes (over the sessions' held bytes alone) fit
        the budget beside the ones kept: called once a session is known to fit without them."""
        if self.budget_bytes is None or not self.snapshots.nbytes:
            return
        over = self.bytes_in_use + self.snapshots.nbytes + needed - self.budget_bytes
        if over > 0:
            self.snapshots.reclaim(over)

    def get(self, key: str) -> S:
        """The state of `key`, or `SessionLost`."""
        entry = self._entries.get(key)
        if entry is None or entry.state is None:
            raise SessionLost(
                "this replica holds no state for the session (expired, closed or restarted); "
                "start again with image and prompt"
            )
        return entry.state

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Mark a call of `key` in progress (it cannot expire meanwhile); refreshes its TTL.

        `SessionLost` when the key is not held. A `pop` during the call still removes it.
        """
        self.get(key)
        entry = self._entries[key]
        entry.active += 1
        entry.release_at = None  # used again (a resumed session): no longer about to be closed
        try:
            yield
        finally:
            entry.active -= 1
            entry.last_used = self._clock()

    def pop(self, key: str) -> Optional[S]:
        """Remove `key` (or its reservation); its state (to free) or None when absent or opening."""
        entry = self._entries.pop(key, None)
        return None if entry is None else entry.state

    def retire(self, key: str) -> Optional[tuple[S, int]]:
        """Remove a held session at once (its slot is free for the next open) while its bytes
        stay counted until `released(nbytes)`: a call in progress may still use its state.

        (state, nbytes); None when there is nothing to free now: the key is absent (its open,
        should it still arrive, is then refused) or being opened (the open gives the
        reservation back and frees what it built when it ends)."""
        self._closed[key] = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.state is None:
            if entry.building:
                entry.closing = True  # its memory is being allocated: counted until the open frees it
            else:
                del self._entries[key]  # still queued: the slot is free at once, nothing was built
            return None
        del self._entries[key]
        self._retiring_bytes += entry.nbytes
        return entry.state, entry.nbytes

    def _forget_closed(self) -> None:
        horizon = self._clock() - CLOSED_MEMORY_S
        while self._closed:
            key, at = next(iter(self._closed.items()))  # insertion order = closing order
            if at > horizon and len(self._closed) <= CLOSED_MEMORY_MAX:
                break
            del self._closed[key]

    def released(self, nbytes: int) -> None:
        """A retired session's state has been freed: its bytes no longer count."""
        assert 0 <= nbytes <= self._retiring_bytes, "released more than was retired"
        self._retiring_bytes -= nbytes

    def pop_expired(self) -> list[tuple[str, Optional[S]]]:
        """Remove and return the sessions idle for longer than the TTL (state None: a
        reservation whose open never came, nothing to free)."""
        now = self._clock()
        keys = [
            k for k, e in self._entries.items()
            if e.active == 0 and now - e.last_used > self.idle_ttl_s
        ]
        return [(k, self._entries.pop(k).state) for k in keys]
