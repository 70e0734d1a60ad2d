"""WorldSpill: the world in the store that holds a session's spilled chunks (the journal's side
is deployments/worlds/journal_spill.py: which chunks, their digests, when they go and come back).

One per world a session writes (sessions.py) or was revived or opened from (revive.py,
requests.py): `latents` reads the clean latents of the chunks asked for, each checked against its
commit record, in a worker thread; a store that fails or a chunk that is not there (the world
deleted, rewritten) is `session_lost`, saying so.

A parked session's journal goes to the parking deployment and back to whichever ingress replica
claims it (Ray pickles it): a WorldSpill travels as its principal and world id only, and reads
through the store of the process it is in (`use_worlds`: each ingress replica's WorldKeeping
names its own; every ingress replica of an app opens the same store).
"""
from __future__ import annotations

import asyncio
from typing import Optional

import numpy as np

from deployments.errors import SessionLost
from deployments.worlds.errors import StoreUnavailable, WorldError
from deployments.worlds.worlds import Worlds


_process_worlds: list[Worlds] = []  # this process's store (an ingress replica's), for spills that travelled


def use_worlds(worlds: Worlds) -> None:
    """This process reads travelled spills through `worlds` (WorldKeeping, once per replica)."""
    _process_worlds[:] = [worlds]


def _travelled(principal: str, world_id: str) -> "WorldSpill":
    return WorldSpill(None, principal, world_id)


class WorldSpill:
    def __init__(self, worlds: Optional[Worlds], principal: str, world_id: str) -> None:
        self.worlds = worlds  # None: the process's (`use_worlds`)
        self.principal = principal
        self.world_id = world_id

    def __reduce__(self):  # no store handle across processes (it holds locks and connections)
        return _travelled, (self.principal, self.world_id)

    async def latents(self, chunks: list[int]) -> dict[int, np.ndarray]:
        if self.worlds is None:
            if not _process_worlds:
                raise SessionLost("this server keeps no world store here: the session's older chunks cannot be "
                                  "read back; start it again")
            self.worlds = _process_worlds[0]
        try:
            return await asyncio.to_thread(self._read, chunks)
        except StoreUnavailable:
            raise SessionLost("this session's older chunks live in the world store, which did not answer: it cannot "
                              "be rebuilt now; try again shortly") from None
        except WorldError as e:
            raise SessionLost(f"this session's older chunks are no longer in the world store ({e.code}): it cannot "
                              "be rebuilt; start it again") from None

    def _read(self, chunks: list[int]) -> dict[int, np.ndarray]:
        return {k: self.worlds.chunk_latents(self.principal, self.world_id, k) for k in chunks}
