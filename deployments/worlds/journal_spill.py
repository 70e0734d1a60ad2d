"""Spill: a session journal's chunks beyond its byte budget, kept in the world store instead of
memory (deployments/ingress/journal.py; the store side is deployments/ingress/worlds/spill.py).

Without a store, a journal over `sessions.journal_max_mib` drops everything and its session can
no longer be rebuilt. Where the session's world is kept (`worlds.enabled`), its chunks are
written behind the stream anyway; once the writer confirms that chunk k is in the store
(`SessionJournal.in_store`: the very PastChunk the journal holds, so a chunk of a branch a
rewind took back is never confused with it), a journal over its budget lets go of the clean
latents of its oldest confirmed chunks (the bulk of a chunk: camera, y, noise state and prompt
updates stay), never of its last chunk, and remembers each one's digest and the world it is in.
A rebuild (history/recovery.py, history/rebuild.py) reads them back (`filled`): each checked
against its digest, so a world rewritten or deleted meanwhile is `session_lost`, never a wrong
continuation. A journal over its budget by chunks the store has not confirmed (the store is
down or behind) keeps them until it does, up to twice its budget; past that it is dropped as
before. A fork's or a rewind's prefix keeps the spilled chunks of its first chunks, read from
the world they are in.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional, Protocol

import numpy as np

from deployments.errors import SessionLost
from deployments.wire import PastChunk

HARD_FACTOR = 2  # a spilling journal is dropped once what it must hold passes this many budgets


class SpillSource(Protocol):
    """A world in the store that holds a session's chunks."""

    async def latents(self, chunks: list[int]) -> dict[int, np.ndarray]:
        """The clean latents of these chunks as stored (SessionLost when the store cannot say)."""
        ...


def latents_digest(a: np.ndarray) -> str:
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


class Spill:
    """Which chunks of one journal the store has (`stored`) and which live only there (`spilled`)."""

    def __init__(self, source: Optional[SpillSource] = None) -> None:
        self.source = source  # the world chunks confirmed from now on are in
        self.stored: dict[int, SpillSource] = {}  # chunk -> the world it was confirmed in
        self.spilled: dict[int, tuple[SpillSource, str]] = {}  # chunk -> (its world, its latents' digest)

    def prefix(self, chunks: int) -> "Spill":
        other = Spill(self.source)
        other.stored = {k: s for k, s in self.stored.items() if k < chunks}
        other.spilled = {k: v for k, v in self.spilled.items() if k < chunks}
        return other

    @staticmethod
    def hard_limit(max_bytes: int) -> int:
        return HARD_FACTOR * max_bytes

    def let_go(self, chunks: list[PastChunk], need: int) -> int:
        """Let go of the latents of confirmed chunks, oldest first and never the last one, until
        `need` bytes are freed; the bytes freed."""
        freed = 0
        for k in sorted(self.stored):
            if freed >= need:
                break
            if k >= len(chunks) - 1 or k in self.spilled:
                continue
            c = chunks[k]
            self.spilled[k] = (self.stored[k], latents_digest(c.latents))
            chunks[k] = dataclasses.replace(c, latents=None)
            freed += c.latents.nbytes
        return freed

    async def filled(self, chunks: list[PastChunk]) -> list[PastChunk]:
        """`chunks` with every spilled chunk's latents read back and checked."""
        out = list(chunks)
        wanted = sorted(k for k in self.spilled if k < len(out))
        by_source: dict[int, tuple[SpillSource, list[int]]] = {}
        for k in wanted:
            source = self.spilled[k][0]
            by_source.setdefault(id(source), (source, []))[1].append(k)
        for source, ks in by_source.values():
            loaded = await source.latents(ks)
            for k in ks:
                a = loaded.get(k)
                if a is None or latents_digest(a) != self.spilled[k][1]:
                    raise SessionLost(f"chunk {k} of this session is no longer in its world in the store as it was "
                                      "made (the world was changed or deleted): it cannot be rebuilt; start it again")
                out[k] = dataclasses.replace(out[k], latents=a)
        return out
