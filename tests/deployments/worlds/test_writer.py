"""The write-behind writer (deployments/worlds/writer.py): chunks queued without I/O, written in
order off the loop; a store that is down or slow degrades it to memory, and when the store
returns everything queued is written (a local store made to fail; a real S3 server stopped and
started again mid-stream)."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from deployments.config import AppArgs
from deployments.worlds.errors import QuotaExceeded, WriterFull
from deployments.worlds.journal_parts import journal_from_world, journal_records
from deployments.worlds.local import LocalStore
from deployments.worlds.worlds import Worlds
from deployments.worlds.writer import WorldWriter
from seaweed import SeaweedServer, s3_store
from worlds_support import OPTIONS, Switchable, make_journal


def same_chunks(worlds: Worlds, world_id: str, journal, n: int) -> None:
    back = journal_from_world(worlds.load("alice", world_id), 1 << 30)
    assert len(back.chunks) == n
    for a, b in zip(journal.chunks[:n], back.chunks):
        assert np.array_equal(a.latents, b.latents) and np.array_equal(a.poses, b.poses) and np.array_equal(a.y, b.y)


def start_world(worlds: Worlds, chunks: int = 5):
    journal = make_journal(chunks)
    m = worlds.create("alice", "lake", AppArgs(), OPTIONS, journal.image, journal.context)
    return journal, journal_records(journal), m.world_id


def submit(writer: WorldWriter, records, world_id: str, which) -> None:
    for k in which:
        writer.submit("alice", world_id, records[k], records[k - 1].past.y if k else None)


def started(root, **options):
    """A world of 5 chunks on a switchable local store, and a started writer with `options`."""
    store = Switchable(root)
    worlds = Worlds(store)
    journal, records, wid = start_world(worlds)
    writer = WorldWriter(worlds, **options)
    writer.start()
    return store, worlds, journal, records, wid, writer


def test_a_store_that_goes_down_degrades_to_memory_and_catches_up(tmp_path):
    async def main():
        store, worlds, journal, records, wid, writer = started(tmp_path, max_queue=8, max_backoff_s=0.2)
        submit(writer, records, wid, [0, 1])
        assert await writer.flush(10)
        store.down = True
        submit(writer, records, wid, [2, 3, 4])
        while writer.failures < 2:
            await asyncio.sleep(0.02)
        health = writer.health()
        assert health["degraded"] and health["queued"] == 3 and "down" in health["last_error"]
        store.down = False
        assert await writer.flush(10)
        assert not writer.health()["degraded"] and writer.written == 5
        same_chunks(worlds, wid, journal, 5)
        await writer.close()

    asyncio.run(main())


def test_the_queue_is_bounded_and_what_it_accepted_is_written(tmp_path):
    async def main():
        store, worlds, journal, records, wid, writer = started(tmp_path, max_queue=2, max_backoff_s=0.2)
        store.down = True
        submit(writer, records, wid, [0, 1])
        with pytest.raises(WriterFull):
            submit(writer, records, wid, [2])
        store.down = False
        assert await writer.flush(10)
        submit(writer, records, wid, [2])
        assert await writer.flush(10)
        same_chunks(worlds, wid, journal, 3)
        await writer.close()

    asyncio.run(main())


def test_submit_never_waits_for_a_slow_store(tmp_path):
    async def main():
        store, worlds, journal, records, wid, writer = started(tmp_path, slow_s=0.05)
        store.hold = threading.Event()  # every put waits until released
        submit(writer, records, wid, [0, 1, 2])  # returns at once: no I/O in submit
        await asyncio.sleep(0.2)  # the loop runs on while a put is blocked in the writer's thread
        assert writer.queued == 3 and writer.written == 0 and writer.health()["degraded"]
        store.hold.set()
        assert await writer.flush(10)
        assert not writer.health()["degraded"]
        same_chunks(worlds, wid, journal, 3)
        await writer.close()

    asyncio.run(main())


def test_a_write_refused_for_good_is_reported_and_the_queue_goes_on(tmp_path):
    async def main():
        worlds = Worlds(LocalStore(tmp_path))
        journal, records, wid = start_world(worlds)
        other = worlds.create("bob", "b", AppArgs(), OPTIONS, journal.image)
        worlds.create("alice", "big", AppArgs(), OPTIONS, np.zeros((200, 200, 3), np.uint8))  # 120 kB more
        worlds.quota_bytes = worlds.usage("alice") + 10  # alice's next chunk cannot fit; bob's can
        refused = []
        writer = WorldWriter(worlds, on_refused=lambda job, e: refused.append((job.record.index, type(e))))
        writer.start()
        submit(writer, records, wid, [0])
        writer.submit("bob", other.world_id, records[0], None)
        assert await writer.flush(10)
        assert refused == [(0, QuotaExceeded)] and writer.refused == 1 and writer.written == 1
        assert worlds.manifest("bob", other.world_id).chunks == 1
        await writer.close()

    asyncio.run(main())


def test_an_s3_server_stopped_and_started_mid_stream_loses_nothing(tmp_path, s3_credentials):
    server = SeaweedServer(tmp_path)
    server.start()
    try:
        async def main():
            worlds = Worlds(s3_store(server, timeout_s=2.0))
            journal, records, wid = start_world(worlds)
            writer = WorldWriter(worlds, max_backoff_s=0.5)
            writer.start()
            submit(writer, records, wid, [0, 1])
            assert await writer.flush(20)
            server.stop()
            submit(writer, records, wid, [2, 3, 4])
            while writer.failures < 1:
                await asyncio.sleep(0.05)
            assert writer.health()["degraded"] and writer.queued == 3
            await asyncio.to_thread(server.start)
            assert await writer.flush(60)
            assert not writer.health()["degraded"] and writer.written == 5
            same_chunks(worlds, wid, journal, 5)
            await writer.close()

        asyncio.run(main())
    finally:
        server.stop()
