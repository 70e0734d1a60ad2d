"""SnapshotShelf: copies of sessions' state after their chunks, kept by one replica (issue 33).

A stateful replica (DiT, VAE) with a snapshot budget (`prefix_cache.snapshot_mib`) keeps copies
of its sessions' state under the id `<routing key>#<k>` (k: the chunks done): copy before
write (a session's state after k chunks is copied on the device when its chunk k + 1 starts,
so a snapshot never duplicates a live session's current state, and a shelf with room for one
holds its state before the newest chunk: an undo), and a session's final state kept when it is
closed (no copy: its memory moves to the shelf). A fork below a session's head, a rewind and
a session leaving the prefix store then start from a copy of one (`clone` from a snapshot id)
instead of replaying the journal's k chunks. A snapshot outlives its session (the prefix store
refers to it). Snapshots are a cache: bounded by bytes, and shared fairly between principals
(issue 43): an eviction takes the least recently used snapshot of the owner (deployments/wire.py
`owner_of` its routing key: an API key, else a client address) that holds the most bytes, so
one principal's sessions evict another's snapshots only while that one holds more; they give
way to sessions (the replica's `SessionTable` reclaims their bytes before it refuses
a session), so they never cost a session its admission and never run a device out of memory;
one being copied from is held (`holding`): not evicted, its bytes counted for the copy's
admission. An evicted snapshot's memory is freed with its last reference.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

from deployments.wire import owner_of

T = TypeVar("T")

SEPARATOR = "#"


def snapshot_id(routing_key: str, chunks: int) -> str:
    """The id of a session's state after `chunks` chunks (what `clone` names)."""
    return f"{routing_key}{SEPARATOR}{chunks}"


def parse_snapshot_id(sid: str) -> Optional[tuple[str, int]]:
    """(routing key, chunks) of a snapshot id; None for anything else (a session's routing key)."""
    base, sep, k = sid.rpartition(SEPARATOR)
    if not sep or not base or not k.isdigit():
        return None
    return base, int(k)


Item = tuple[str, int, str]  # (routing key, chunks, part): a VAE keeps its encoder and decoder apart


@dataclass(slots=True)
class _Shelved(Generic[T]):
    value: Optional[T]  # None: booked, its copy on its way (`book`, then `fill`)
    nbytes: int
    holds: int = 0  # copies being made from it (`holding`): not evicted meanwhile


class SnapshotShelf(Generic[T]):
    """Snapshots by (routing key, chunks, part), at most `max_bytes` held; 0 keeps none.

    Used from the replica's event loop only: the model thread copies a session's state between
    a `book` (bytes counted, older snapshots evicted for it) and a `fill`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Item, _Shelved[T]] = OrderedDict()  # oldest first
        self.nbytes = 0
        self.evictions = 0
        self.taken = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._items)

    def ids(self) -> list[str]:
        """The snapshot ids held (each once, whatever its parts)."""
        return list(dict.fromkeys(snapshot_id(key, k) for key, k, _ in self._items))

    def fits(self, nbytes: int) -> bool:
        """Whether a snapshot of `nbytes` may be kept at all."""
        return 0 < nbytes <= self.max_bytes

    def book(self, key: str, chunks: int, nbytes: int, part: str = "") -> bool:
        """Count `nbytes` for the state of `key` after `chunks` chunks (replacing one kept), the
        oldest others evicted to make room; False (nothing booked) when it alone is over the
        budget. Its value comes with `fill`; until then `get` finds nothing."""
        if not self.fits(nbytes):
            return False
        self._pop((key, chunks, part))
        self._items[(key, chunks, part)] = _Shelved(None, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes and self._evict_oldest(keep=(key, chunks, part)):
            pass
        if self.nbytes > self.max_bytes:  # the rest is being copied from: no room after all
            self._pop((key, chunks, part))
            return False
        return True

    def fill(self, key: str, chunks: int, value: T, part: str = "") -> bool:
        """The copy a `book` counted for; False (dropped) when it was evicted meanwhile."""
        item = self._items.get((key, chunks, part))
        if item is None or item.value is not None:
            return False
        item.value = value
        self.taken += 1
        return True

    def cancel(self, key: str, chunks: int, part: str = "") -> None:
        """A booking whose copy failed."""
        item = self._items.get((key, chunks, part))
        if item is not None and item.value is None:
            self._pop((key, chunks, part))

    def put(self, key: str, chunks: int, value: T, nbytes: int, part: str = "") -> bool:
        """`book` and `fill` at once."""
        return self.book(key, chunks, nbytes, part) and self.fill(key, chunks, value, part)

    @contextmanager
    def holding(self, key: str, chunks: int, part: str = "") -> Iterator[None]:
        """While a copy is made from that snapshot: it is not evicted, and its bytes count as
        in use (`held_bytes`: admission counts them, the copy needs its own room beside it)."""
        item = self._items.get((key, chunks, part))
        if item is not None:
            item.holds += 1
        try:
            yield
        finally:
            if item is not None:
                item.holds -= 1

    @property
    def held_bytes(self) -> int:
        """Bytes of the snapshots being copied from (never evicted meanwhile)."""
        return sum(item.nbytes for item in self._items.values() if item.holds)

    def has(self, key: str, chunks: int, part: str = "") -> bool:
        """Whether that snapshot is kept or booked (not marked used)."""
        return (key, chunks, part) in self._items

    def get(self, key: str, chunks: int, part: str = "") -> Optional[T]:
        """The state of `key` after `chunks` chunks (marked used), or None when not kept."""
        item = self._items.get((key, chunks, part))
        if item is None or item.value is None:
            return None
        self._items.move_to_end((key, chunks, part))
        return item.value

    def drop_after(self, key: str, chunks: int) -> int:
        """Drop `key`'s snapshots after more than `chunks` chunks (a rewind to `chunks`: they
        were of the branch it left); how many."""
        later = [ik for ik in self._items if ik[0] == key and ik[1] > chunks]
        for ik in later:
            self._pop(ik)
        return len(later)

    def reclaim(self, nbytes: int) -> int:
        """Evict the oldest snapshots until `nbytes` are freed or none is left that may go (one
        being copied from stays); the bytes freed."""
        freed = 0
        while freed < nbytes:
            evicted = self._evict_oldest()
            if not evicted:
                break
            freed += evicted
        return freed

    def _evict_oldest(self, keep: Optional[Item] = None) -> int:
        """Evict the least recently used snapshot not being copied from (nor `keep`) of the
        owner holding the most bytes (`keep` counted) among those with one that may go; its
        bytes (0: none may go)."""
        held: Counter[str] = Counter()
        for (key, _, _), item in self._items.items():
            held[owner_of(key)] += item.nbytes
        oldest: dict[str, Item] = {}  # per owner, its least recently used that may go
        for ik, item in self._items.items():
            if not item.holds and ik != keep:
                oldest.setdefault(owner_of(ik[0]), ik)
        if not oldest:
            return 0
        owner = max(oldest, key=lambda o: held[o])  # ties: the one whose snapshot is oldest (dict order)
        self.evictions += 1
        return self._pop(oldest[owner])

    def _pop(self, ik: Item) -> int:
        item = self._items.pop(ik, None)
        if item is None:
            return 0
        self.nbytes -= item.nbytes
        return item.nbytes
