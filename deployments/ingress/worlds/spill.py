"""WorldSpill: the world in the store that holds a session's spilled chunks (the journal's side
is deployments/worlds/journal_spill.py: which chunks, their digests, when they go and come back).

One per world a session writes (sessions.py) or was revived or opened from (revive.py,
requests.py): `latents` reads the clean latents of the chunks asked for, each checked against its
commit record, in a worker thread; a store that fails or a chunk that is not there (the world
deleted, rewritten) is `session_lost`, saying so.
"""
from __future__ import annotations

import asyncio

import numpy as np

from deployments.errors import SessionLost
from deployments.worlds.errors import StoreUnavailable, WorldError
from deployments.worlds.worlds import Worlds


class WorldSpill:
    def __init__(self, worlds: Worlds, principal: str, world_id: str) -> None:
        self.worlds = worlds
        self.principal = principal
        self.world_id = world_id

    async def latents(self, chunks: list[int]) -> dict[int, np.ndarray]:
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
