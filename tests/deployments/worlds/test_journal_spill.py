"""A journal over its budget spills to the world store (deployments/worlds/journal_spill.py):
the latents of the chunks its world has are let go from memory and read back, checked, to
rebuild (before: the journal dropped everything and the session could not be rebuilt)."""
from __future__ import annotations

import asyncio
import dataclasses
import pickle

import numpy as np
import pytest

from deployments.config import AppArgs
from deployments.errors import SessionLost
from deployments.ingress.journal import SessionJournal
from deployments.ingress.parking import new_token, token_digest
from deployments.ingress.stream import Stream
from deployments.ingress.worlds.keeping import WorldKeeping
from deployments.ingress.worlds.sessions import SessionWorlds
from deployments.worlds.worlds import Worlds
from worlds_support import OPTIONS, Switchable, make_journal

PRINCIPAL = "addr:10.0.0.7"
CHUNKS = 5
REFERENCE = make_journal(CHUNKS)  # what the session makes, chunk by chunk
LATENTS = REFERENCE.chunks[0].latents.nbytes


def budget_for(spilled: int) -> int:
    """A budget the whole journal passes by `spilled` chunks' latents."""
    return REFERENCE.nbytes - spilled * LATENTS


def add(journal: SessionJournal, k: int, source: SessionJournal = REFERENCE) -> None:
    c = source.chunks[k]
    if k in source.steering:
        journal.steer(k, source.steering[k])
    journal.add_chunk(c.poses, c.intrinsics, c.y, c.latents, source.noises[k], c.context, c.kv_growth)
    journal.conditioned = journal.decoded = k + 1


def kept_session(tmp_path, max_bytes: int):
    """A stream whose journal has the budget `max_bytes`, kept in a local store, and a driver that
    makes its chunks one by one, each handed to the writer as its reply is built."""
    keeping = WorldKeeping(AppArgs.model_validate({"worlds": {"enabled": True}}), Worlds(Switchable(tmp_path)))
    journal = SessionJournal(REFERENCE.image, max_bytes)
    journal.set_context(REFERENCE.context)
    stream = Stream(OPTIONS, journal, journal.image)
    token = new_token()
    worlds = SessionWorlds(keeping, PRINCIPAL, lambda n: None, lambda s: token_digest(token))

    async def make(ks) -> None:
        for k in ks:
            add(journal, k)
            worlds.kept(stream, k, f"video {k}".encode())
            assert await keeping.writer.flush(30)
    return keeping, stream, worlds, token, make


def same_latents(chunks, reference=REFERENCE.chunks) -> bool:
    return len(chunks) == len(reference) and all(np.array_equal(a.latents, b.latents)
                                                 for a, b in zip(chunks, reference))


def test_without_a_store_a_journal_over_its_budget_is_dropped():
    journal = SessionJournal(REFERENCE.image, budget_for(2))
    journal.set_context(REFERENCE.context)
    for k in range(CHUNKS):
        add(journal, k)
    assert not journal.recoverable and journal.chunks == []


def test_chunks_the_store_has_not_confirmed_are_kept_up_to_twice_the_budget():
    """A store down or behind confirms nothing: the journal keeps its chunks past its budget (they
    go once written) until it holds twice its budget; then it is dropped as without a store."""
    budget = REFERENCE.nbytes // 3
    journal = SessionJournal(REFERENCE.image, budget)
    journal.spill_to(object())  # a world that never confirms a chunk
    journal.set_context(REFERENCE.context)
    kept = []
    for k in range(CHUNKS):
        add(journal, k)
        kept.append((journal.recoverable, journal.nbytes > budget))
    first_over = next(i for i, (_, over) in enumerate(kept) if over)
    assert kept[first_over][0]  # over its budget, still recoverable
    assert not journal.recoverable and journal.chunks == []  # past twice the budget: dropped


def test_the_chunks_its_world_has_are_let_go_and_read_back_to_rebuild(tmp_path):
    budget = budget_for(2)

    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget)
        await make(range(CHUNKS))
        j = stream.journal
        held = [c.latents is not None for c in j.chunks]
        full = await j.full_chunks()
        decoded = await j.full_decoded_latents()
        await keeping.writer.close()
        return j, held, full, decoded

    j, held, full, decoded = asyncio.run(main())
    assert j.recoverable and j.nbytes <= budget
    assert held == [False, False, True, True, True]  # the oldest went, the last never does
    assert same_latents(full) and all(np.array_equal(a, c.latents) for a, c in zip(decoded, REFERENCE.chunks))
    assert all(np.array_equal(a.y, b.y) and np.array_equal(a.poses, b.poses) for a, b in zip(full, REFERENCE.chunks))


class _Method:
    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self, *args):
        self.calls.append((self.name, args))

        async def answer() -> str:
            return "replica-2"
        return answer()


class _Handle:
    """A deployment handle that records `restore` and `close` (recovery.py's calls)."""

    def __init__(self) -> None:
        self.calls: list = []
        self.restore, self.close = _Method(self.calls, "restore"), _Method(self.calls, "close")

    def options(self, **_):
        return self


def test_a_lost_replica_is_rebuilt_from_the_chunks_read_back(tmp_path):
    """history/recovery.py: the DiT's `restore` gets every chunk with its latents, the VAE's every
    decoded chunk's latents, the spilled ones read back from the store."""
    import logging

    from deployments.config import SessionArgs
    from deployments.ingress.history.recovery import Recovery
    from deployments.log import KeyValueLog

    class Metrics:
        def count_recovery(self, *_, **__) -> None:
            pass

    dit, vae = _Handle(), _Handle()

    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        assert stream.journal.chunks[0].latents is None  # spilled
        recovery = Recovery(dit, vae, SessionArgs(), KeyValueLog(logging.getLogger("t"), {}), Metrics())
        await recovery.dit(stream, RuntimeError("the DiT replica died"))
        await recovery.vae(stream, RuntimeError("the VAE replica died"))
        await keeping.writer.close()

    asyncio.run(main())
    past = next(args for name, args in dit.calls if name == "restore")[3]
    decoded = next(args for name, args in vae.calls if name == "restore")[4]
    assert same_latents(past) and len(decoded) == CHUNKS
    assert all(np.array_equal(a, c.latents) for a, c in zip(decoded, REFERENCE.chunks))


def test_a_rewound_session_reads_back_only_its_own_branch(tmp_path):
    """Rewound to chunk 1 and made anew from other inputs: chunk 1 of the new branch is not the
    spilled one of the old; the rebuild gets the new branch's chunks (the store's, once written)."""
    other = make_journal(CHUNKS, seed=9)

    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        j = stream.journal
        j.truncate(1)
        for k in range(1, CHUNKS):
            add(j, k, other)
            worlds.kept(stream, k, b"again")
            assert await keeping.writer.flush(30)
        full = await j.full_chunks()
        await keeping.writer.close()
        return j, full

    j, full = asyncio.run(main())
    assert j.recoverable and [c.latents is None for c in j.chunks] == [True, True, False, False, False]
    assert same_latents(full, [REFERENCE.chunks[0], *other.chunks[1:]])


def test_a_fork_reads_its_first_chunks_from_the_parents_world(tmp_path):
    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        fork = stream.journal.prefix(3)
        full = await fork.full_chunks()
        await keeping.writer.close()
        return fork, full

    fork, full = asyncio.run(main())
    assert fork.chunks[0].latents is None and same_latents(full, REFERENCE.chunks[:3])


def test_a_forks_own_world_is_written_from_its_spilled_chunks_read_back(tmp_path):
    """A fork at chunk 3 of a spilled journal gets a world of its own when its chunk is kept:
    chunks 0 and 1 (spilled) are read back from the parent's world and written into it."""
    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        fork = Stream(dataclasses.replace(OPTIONS, session_id="fork"), stream.journal.prefix(3), stream.image)
        mine = SessionWorlds(keeping, PRINCIPAL, lambda n: None, lambda s: None)  # no token: a world id of its own
        mine.kept(fork, 2, b"fork video 2")
        assert await mine.written(fork, 30)
        world = keeping.worlds.load(PRINCIPAL, mine.world_of(fork))
        await keeping.writer.close()
        return fork, world

    fork, world = asyncio.run(main())
    assert fork.journal.chunks[0].latents is None
    assert same_latents([c.past for c in world.chunks], REFERENCE.chunks[:3])
    assert world.chunks[2].video == b"fork video 2"


def test_a_parked_spilled_journal_travels_and_reads_back_through_the_claimants_store(tmp_path):
    """Parking pickles the journal (Ray, to the parking deployment and back): the spill goes as
    its principal and world id (a store handle holds locks: it cannot be pickled) and reads
    through the store of the process that claims it."""
    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        travelled = pickle.loads(pickle.dumps(stream.journal))
        WorldKeeping(keeping.args, Worlds(Switchable(tmp_path)))  # the claiming replica's (the same store)
        full = await travelled.full_chunks()
        await keeping.writer.close()
        return travelled, full

    travelled, full = asyncio.run(main())
    assert travelled.recoverable and travelled.chunks[0].latents is None and same_latents(full)


def test_a_world_deleted_or_changed_meanwhile_is_session_lost(tmp_path):
    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        world_id = worlds.world_of(stream)
        keeping.worlds.delete(PRINCIPAL, world_id)
        with pytest.raises(SessionLost, match="no longer in the world store"):
            await stream.journal.full_chunks()
        await keeping.writer.close()

    asyncio.run(main())


def test_a_store_that_is_down_when_a_rebuild_reads_is_session_lost_saying_so(tmp_path):
    async def main():
        keeping, stream, worlds, _, make = kept_session(tmp_path, budget_for(2))
        await make(range(CHUNKS))
        keeping.worlds.store.down = True
        with pytest.raises(SessionLost, match="did not answer"):
            await stream.journal.full_chunks()
        await keeping.writer.close()

    asyncio.run(main())


def test_a_world_larger_than_the_budget_is_revived_spilled(tmp_path):
    """Before: `session_lost` (larger than sessions.journal_max_mib)."""
    async def main():
        keeping, stream, worlds, token, make = kept_session(tmp_path, 1 << 30)
        await make(range(CHUNKS))
        keeping.args = AppArgs.model_validate({"worlds": {"enabled": True},
                                               "sessions": {"journal_max_mib": budget_for(2) / 2**20}})
        parked = await worlds.revive(OPTIONS.session_id, token)
        full = await parked.journal.full_chunks()
        await keeping.writer.close()
        return parked.journal, full

    j, full = asyncio.run(main())
    assert j.recoverable and j.nbytes <= budget_for(2) and [c.latents is None for c in j.chunks][:2] == [True, True]
    assert same_latents(full)
