"""A connection's sessions kept in the world store (deployments/ingress/worlds/), on both
backends, without Ray: each chunk handed to the writer when its reply is built lands in the
session's world; a resume token the parking does not know finds its session there and makes
back the journal the session had; a changed model is refused naming the fields; a store that is
down tells the client once, and nothing is lost when it returns; a rewound session's world
follows its new branch."""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from deployments.config import AppArgs
from deployments.errors import WorldChanged
from deployments.ingress.parking import new_token, token_digest
from deployments.ingress.stream import Stream
from deployments.ingress.worlds.keeping import WorldKeeping, world_of_token
from deployments.ingress.worlds.sessions import SessionWorlds
from deployments.wire import NoiseSnapshot
from deployments.worlds.worlds import Worlds
from protocol.errors import ErrorCode
from worlds_support import OPTIONS, Switchable, make_journal

VIDEOS = [b"init+moof0", b"moof1", b"moof2"]


def keeping_on(store, **args) -> WorldKeeping:
    return WorldKeeping(AppArgs.model_validate({"worlds": {"enabled": True}, **args}), Worlds(store))


def a_session(keeping: WorldKeeping, chunks: int = 3):
    """A stream with a journal of `chunks` chunks, its token, and its connection's SessionWorlds."""
    journal = make_journal(chunks)
    stream = Stream(OPTIONS, journal, journal.image)
    token, notices = new_token(), []
    worlds = SessionWorlds(keeping, "addr:10.0.0.7", notices.append,
                           lambda s: token_digest(token) if s is stream else None)
    return stream, token, worlds, notices


def same_journals(a, b) -> None:
    assert len(a.chunks) == len(b.chunks)
    for x, y in zip(a.chunks, b.chunks):
        for f in ("poses", "intrinsics", "y", "latents"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), f
    assert [n.rng.tobytes() for n in a.noises] == [n.rng.tobytes() for n in b.noises]
    assert a.steering == b.steering and np.array_equal(a.context, b.context) and np.array_equal(a.image, b.image)


def test_each_chunk_lands_in_the_sessions_world_and_a_token_revives_it(store):
    async def main():
        keeping = keeping_on(store)
        stream, token, worlds, notices = a_session(keeping)
        for k in range(3):
            worlds.kept(stream, k, VIDEOS[k])
        assert await keeping.writer.flush(30)
        assert worlds.world_of(stream) == world_of_token(token_digest(token))
        world = keeping.worlds.load("addr:10.0.0.7", worlds.world_of(stream))
        assert [c.video for c in world.chunks] == VIDEOS and world.manifest.title == OPTIONS.session_id
        parked = await worlds.revive(OPTIONS.session_id, token)
        assert parked is not None and parked.next_chunk == parked.sent == 3 and parked.token_digest == token_digest(token)
        same_journals(stream.journal, parked.journal)
        assert parked.journal.recoverable and parked.journal.conditioned == parked.journal.decoded == 3
        assert parked.prompt == "the lake freezes"  # after its prompt update at chunk 1
        mine = dataclasses.replace(parked.spec, owner="")
        assert mine == OPTIONS
        # another session id, another token, another principal: not found (None: the claim is refused as before)
        assert await worlds.revive("s2", token) is None
        assert await worlds.revive(OPTIONS.session_id, new_token()) is None
        other = SessionWorlds(keeping, "addr:10.0.0.8", notices.append, lambda s: None)
        assert await other.revive(OPTIONS.session_id, token) is None
        assert notices == [] and keeping.health()["written"] == 3
        await keeping.writer.close()

    asyncio.run(main())


def test_a_changed_model_is_refused_naming_what_changed(tmp_path):
    from deployments.worlds.local import LocalStore

    async def main():
        keeping = keeping_on(LocalStore(tmp_path))
        stream, token, worlds, _ = a_session(keeping)
        for k in range(3):
            worlds.kept(stream, k, VIDEOS[k])
        assert await keeping.writer.flush(30)
        await keeping.writer.close()
        changed = keeping_on(LocalStore(tmp_path), model={"dtype": "bfloat16"}, sessions={"max_sessions": 7})
        later = SessionWorlds(changed, "addr:10.0.0.7", lambda n: None, lambda s: None)
        with pytest.raises(WorldChanged) as e:
            await later.revive(OPTIONS.session_id, token)
        assert e.value.code is ErrorCode.WORLD_CHANGED and "model.dtype" in e.value.message
        assert "max_sessions" not in e.value.message  # not part of what a continuation needs
        # field by field, with its values, and the world a `reopen` runs again (ingress/worlds/changes.py)
        assert e.value.changed == ("model.dtype",) and "model.dtype: 'float32' -> 'bfloat16'" in e.value.message
        assert e.value.world_id == world_of_token(token_digest(token)) and "reopen" in e.value.message

    asyncio.run(main())


def test_a_store_that_is_down_is_told_once_and_loses_nothing(tmp_path):
    async def main():
        store = Switchable(tmp_path)
        keeping = keeping_on(store)
        stream, token, worlds, notices = a_session(keeping, chunks=5)
        worlds.kept(stream, 0, b"v0")
        assert await keeping.writer.flush(30)
        store.down = True
        for k in range(1, 4):
            worlds.kept(stream, k, f"v{k}".encode())
            await asyncio.sleep(0.3)  # the writer fails and backs off
        assert keeping.degraded and keeping.health()["queued"] == 3
        assert [n.code for n in notices] == [ErrorCode.STORE_BEHIND]  # once, while the outage lasts
        assert notices[0].is_notice and notices[0].session_id == OPTIONS.session_id
        store.down = False
        assert await keeping.writer.flush(30)
        worlds.kept(stream, 4, b"v4")
        assert await keeping.writer.flush(30) and not keeping.degraded
        world = keeping.worlds.load("addr:10.0.0.7", worlds.world_of(stream))
        assert [c.video for c in world.chunks] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
        await keeping.writer.close()

    asyncio.run(main())


def test_a_rewound_session_writes_its_new_branch(tmp_path):
    from deployments.worlds.local import LocalStore

    async def main():
        keeping = keeping_on(LocalStore(tmp_path))
        stream, token, worlds, _ = a_session(keeping)
        for k in range(3):
            worlds.kept(stream, k, VIDEOS[k])
        j = stream.journal
        j.truncate(1)
        new = j.chunks[0]
        j.add_chunk(new.poses + 1, new.intrinsics, new.y, new.latents * 2, NoiseSnapshot(j.noises[0].rng, False))
        worlds.kept(stream, 1, b"branch")
        assert await keeping.writer.flush(30)
        parked = await worlds.revive(OPTIONS.session_id, token)
        assert parked.next_chunk == 2
        same_journals(j, parked.journal)
        await keeping.writer.close()

    asyncio.run(main())


def test_chunks_the_full_queue_refused_are_written_once_it_has_room(tmp_path):
    """writer_queue 1 and a store that holds every write: chunks 2 and 3 find the queue full
    (one `store_behind` notice); the session holds them (their videos too) and hands them over
    as the queue makes room, with no later chunk to carry them (its last chunks are not lost)."""
    import threading
    import time

    async def main():
        store = Switchable(tmp_path)
        keeping = keeping_on(store, worlds={"enabled": True, "writer_queue": 1})
        stream, token, worlds, notices = a_session(keeping, chunks=4)
        store.hold = threading.Event()  # every put waits until released
        worlds.kept(stream, 0, b"v0")
        await asyncio.sleep(0.2)  # the writer took chunk 0 and waits in its put: the queue is full
        for k in (1, 2, 3):
            worlds.kept(stream, k, f"v{k}".encode())
        assert [n.code for n in notices] == [ErrorCode.STORE_BEHIND]
        store.hold.set()
        store.hold = None
        deadline = time.monotonic() + 30
        while keeping.health()["written"] < 4:
            assert time.monotonic() < deadline, keeping.health()
            await asyncio.sleep(0.1)
        world = keeping.worlds.load("addr:10.0.0.7", worlds.world_of(stream))
        assert [c.video for c in world.chunks] == [b"v0", b"v1", b"v2", b"v3"]
        await keeping.writer.close()

    asyncio.run(main())


def test_a_session_without_a_journal_keeps_no_world(tmp_path):
    """Recovery off (no journal): nothing to write, no world made, nothing held for one."""
    from deployments.ingress.journal import SessionJournal
    from deployments.worlds.local import LocalStore

    async def main():
        keeping = keeping_on(LocalStore(tmp_path))
        image = np.zeros((20, 30, 3), np.uint8)
        stream = Stream(OPTIONS, SessionJournal(image, None), image)
        worlds = SessionWorlds(keeping, "addr:10.0.0.7", lambda n: None, lambda s: None)
        worlds.kept(stream, 0, b"v0")
        assert worlds.world_of(stream) is None and keeping.health()["queued"] == 0
        assert await keeping.writer.flush(5) and keeping.worlds.store.list("") == []
        await keeping.writer.close()

    asyncio.run(main())


def test_written_waits_for_the_sessions_own_chunks_only(tmp_path):
    """A save waits for its session's chunks (`written`): not for another session's queued
    behind them, and not forever for a store that is down."""
    async def main():
        store = Switchable(tmp_path)
        keeping = keeping_on(store)
        a, _, worlds, _ = a_session(keeping, chunks=2)
        b, _, others, _ = a_session(keeping, chunks=2)
        store.down = True
        worlds.kept(a, 0, b"a0")
        assert not await worlds.written(a, 0.3)  # the store is down: not written, answered in time
        store.down = False
        assert await worlds.written(a, 10)
        others.kept(b, 0, b"b0")
        worlds.kept(a, 1, b"a1")
        assert await worlds.written(a, 10) and keeping.worlds.manifest("addr:10.0.0.7", worlds.world_of(a)).chunks == 2
        await keeping.writer.close()

    asyncio.run(main())


def test_a_resumed_session_takes_over_the_chunks_its_old_connection_still_held(tmp_path):
    """Chunks 2 and 3 wait with the old connection for a full queue when the session is parked;
    resumed on a new connection of the same replica, the new record hands them over (their
    videos too) and the old one stops: the world gets every chunk once, in order."""
    import threading
    import time

    async def main():
        store = Switchable(tmp_path)
        keeping = keeping_on(store, worlds={"enabled": True, "writer_queue": 1})
        stream, token, old, _ = a_session(keeping, chunks=5)
        store.hold = threading.Event()
        old.kept(stream, 0, b"v0")
        await asyncio.sleep(0.2)  # chunk 0 in the writer, the queue full
        for k in (1, 2, 3):
            old.kept(stream, k, f"v{k}".encode())
        back = Stream.resumed(OPTIONS, stream.journal, stream.image, ("k", "k", "k"), 4, OPTIONS.prompt)
        new = SessionWorlds(keeping, "addr:10.0.0.7", lambda n: None, lambda s: token_digest(token))
        new.resumed(back)
        new.kept(back, 4, b"v4")  # the resumed session's next chunk, while the store still holds
        store.hold.set()
        store.hold = None
        assert await new.written(back, 30)
        world = keeping.worlds.load("addr:10.0.0.7", new.world_of(back))
        assert [c.video for c in world.chunks] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
        assert keeping.health()["refused"] == 0 and keeping.health()["written"] == 5  # each chunk once
        await keeping.writer.close()

    asyncio.run(main())
