"""Snapshots of sessions on the replicas (deployments/replicas/snapshots.py, issue 33): the shelf's
budget and LRU, snapshots giving way to sessions in the session table, and the DiT and VAE
replicas (tiny model, CPU, no Ray) keeping a copy of a session before each chunk changes it and
its final state when it closes, which `clone` makes into a new session continuing bit for bit
like one that never stopped."""
from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from deployments.config import ModelArgs, SessionArgs
from deployments.errors import Busy, NoSnapshot
from deployments.replicas import dit as dit_module
from deployments.replicas import session_host
from deployments.replicas import vae as vae_module
from deployments.replicas.session_table import SessionTable
from deployments.replicas.snapshots import SnapshotShelf, parse_snapshot_id, snapshot_id
from deployments.wire import ChunkStep, SessionOptions, owner_of, owner_tag, routing_key

MODEL = ModelArgs(preset="tiny", device="cpu", warmup=False, size_buckets=["32*48"], default_size="32*48")
K = np.array([[40, 40, 24, 16.0]], np.float32)


# ---- the shelf ----

def test_ids_name_a_session_key_and_a_chunk_count():
    sid = snapshot_id("a~1f#x~2", 3)
    assert sid == "a~1f#x~2#3" and parse_snapshot_id(sid) == ("a~1f#x~2", 3)
    assert parse_snapshot_id("a~1f") is None and parse_snapshot_id("a#") is None and parse_snapshot_id("#3") is None


def test_the_shelf_keeps_the_most_recently_used_within_its_bytes():
    shelf: SnapshotShelf[str] = SnapshotShelf(100)
    assert shelf.put("a", 1, "a1", 40) and shelf.put("a", 2, "a2", 40)
    assert shelf.get("a", 1) == "a1"  # used: now the most recent
    assert shelf.put("b", 1, "b1", 40)  # over 100: the oldest (a#2) goes
    assert (shelf.get("a", 2), shelf.get("a", 1), shelf.get("b", 1)) == (None, "a1", "b1")
    assert shelf.nbytes == 80 and shelf.evictions == 1 and shelf.ids() == ["a#1", "b#1"]
    assert not shelf.put("c", 1, "c1", 101) and shelf.nbytes == 80  # alone over the budget: not kept
    assert shelf.reclaim(1) == 40 and shelf.ids() == ["b#1"]  # the oldest, whole


def test_a_booking_counts_at_once_and_is_found_only_once_filled():
    shelf: SnapshotShelf[str] = SnapshotShelf(100)
    assert shelf.book("a", 1, 30, "enc")
    assert shelf.nbytes == 30 and shelf.get("a", 1, "enc") is None
    assert shelf.fill("a", 1, "e1", "enc") and shelf.get("a", 1, "enc") == "e1" and shelf.get("a", 1) is None
    assert shelf.book("a", 2, 30) and shelf.reclaim(60) == 60 and not shelf.fill("a", 2, "late")  # evicted meanwhile
    assert shelf.book("a", 3, 30)
    shelf.cancel("a", 3)
    assert shelf.nbytes == 0 and len(shelf) == 0


def test_a_rewind_drops_the_snapshots_of_the_branch_it_leaves():
    shelf: SnapshotShelf[int] = SnapshotShelf(1000)
    for k in (1, 2, 3):
        shelf.put("a", k, k, 10)
        shelf.put("a", k, -k, 5, "enc")
    shelf.put("b", 3, 3, 10)
    assert shelf.drop_after("a", 1) == 4 and shelf.ids() == ["a#1", "b#3"] and shelf.nbytes == 25


def test_routing_keys_carry_their_owners_tag():
    tag = owner_tag("key:A")
    assert tag != owner_tag("key:B") and tag != owner_tag("addr:10.0.0.1") and "key:A" not in tag
    key = routing_key("a~b.c", tag)  # the client's id may hold the separators
    assert key.startswith("a~b.c~") and owner_of(key) == tag
    assert owner_of(routing_key("s")) == "" and owner_of("s") == "" and owner_of("a~1f") == ""


def test_one_principals_sessions_evict_anothers_snapshots_only_down_to_a_fair_share():
    """Issue 43 item 8: one LRU per replica let key A's sessions evict key B's snapshots (B's
    undo fell from the snapshot path to a replay). An eviction now takes the least recently
    used snapshot of the owner holding the most bytes."""
    a, b = owner_tag("key:A"), owner_tag("key:B")
    shelf: SnapshotShelf[str] = SnapshotShelf(100)
    victim = routing_key("undo", b)
    assert shelf.put(victim, 1, "b1", 10) and shelf.put(victim, 2, "b2", 10)  # B's: the oldest of all
    for i in range(20):  # A's sessions churn: 20 sessions of 2 snapshots each
        key = routing_key(f"s{i}", a)
        assert shelf.put(key, 1, f"a{i}", 10) and shelf.put(key, 2, f"a{i}", 10)
    held = {o: sum(10 for key, _, _ in shelf._items if owner_of(key) == o) for o in (a, b)}
    print(f"RELIABILITY snapshots: key B's 2 then key A's 40 (shelf of 10): B keeps {held[b] // 10}, "
          f"A {held[a] // 10}; evictions {shelf.evictions}")
    assert shelf.get(victim, 1) == "b1" and shelf.get(victim, 2) == "b2"  # B's undo is still a snapshot
    assert held == {a: 80, b: 20} and shelf.evictions == 32  # A evicted only its own (its oldest)
    last = [sid for sid in shelf.ids() if owner_of(parse_snapshot_id(sid)[0]) == a]
    assert len(last) == 8 and all(sid.startswith(("s16~", "s17~", "s18~", "s19~")) for sid in last)
    # B, holding less, takes its share back from A (the owner holding the most): A's oldest go ...
    for k in range(3, 6):
        assert shelf.put(victim, k, f"b{k}", 10)
    assert [shelf.get(victim, k) for k in range(1, 6)] == ["b1", "b2", "b3", "b4", "b5"]
    mine = [sid for sid in shelf.ids() if owner_of(parse_snapshot_id(sid)[0]) == a]
    assert len(mine) == 5 and not any(sid.startswith("s16~") for sid in mine)  # A's 3 oldest went
    # ... until it holds the most itself: then its own least recently used goes
    assert shelf.put(victim, 6, "b6", 10) and shelf.get(victim, 1) is None and shelf.get(victim, 6) == "b6"


# ---- the session table ----

def test_snapshots_live_in_spare_bytes_and_give_way_to_sessions():
    table: SessionTable[str] = SessionTable(4, 100, idle_ttl_s=60.0, retry_after_s=1.0)
    table.snapshots = SnapshotShelf(1000)
    table.admit("s1", 30, working=10)
    table.start_building("s1")
    table.add("s1", "state")
    assert table.room_for_snapshot(60)  # 30 held + 10 working + 60 = 100
    table.snapshots.put("s1", 1, "snap1", 60)
    assert not table.room_for_snapshot(61)  # evicts the older one and still does not fit
    assert len(table.snapshots) == 0
    table.snapshots.put("s1", 2, "snap2", 30)
    table.snapshots.put("s1", 3, "snap3", 30)
    table.admit("s2", 30, working=10)  # fits once the oldest snapshot goes: not busy
    assert table.snapshots.ids() == ["s1#3"] and table.bytes_in_use == 60
    with pytest.raises(Busy):  # no room even without snapshots: refused, the snapshot kept
        table.admit("s3", 31)
    assert table.snapshots.ids() == ["s1#3"]
    assert table.reserved_bytes == 70  # snapshots never count as load


def test_a_snapshot_being_copied_from_stays_and_counts_for_admission():
    """A clone's admission must leave the snapshot it copies in place: held, it is never
    evicted, and the new session must fit beside it (else busy)."""
    table: SessionTable[str] = SessionTable(4, 100, idle_ttl_s=60.0, retry_after_s=1.0)
    table.snapshots = SnapshotShelf(100)
    table.snapshots.put("a", 1, "snap", 60)
    with table.snapshots.holding("a", 1):
        with pytest.raises(Busy):
            table.admit("b", 50)  # 60 being copied from + 50 > 100
        table.admit("c", 40)
        assert table.snapshots.ids() == ["a#1"] and table.snapshots.held_bytes == 60
        assert not table.snapshots.book("x", 1, 50)  # only a#1 could make room: no booking
        assert table.snapshots.ids() == ["a#1"]
    assert table.snapshots.held_bytes == 0
    table.admit("d", 30)  # the copy is done: now it gives way
    assert table.snapshots.ids() == [] and table.bytes_in_use == 70


# ---- the replicas (tiny model, CPU, no Ray) ----

@pytest.fixture
def replica_context(monkeypatch):
    ctx = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="test-replica"))
    monkeypatch.setattr(session_host.serve, "get_replica_context", lambda: ctx)


def _new(cls):
    cls = cls.func_or_class
    return cls.__new__(cls)


def _options(sid: str, total_latent_frames=None) -> SessionOptions:
    return SessionOptions(session_id=sid, prompt="a cat", image_digest="d", resolution=(32, 48), seed=1,
                          total_latent_frames=total_latent_frames, translation_scale=None,
                          intrinsics_resolution=(32, 48))


def _chunk(k: int):
    y = np.random.default_rng(k).standard_normal((20, 3, 4, 6)).astype(np.float32)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 0, 3] = 0.05 * np.arange(12) + k
    return y, poses, np.tile(K, (12, 1))


OTHER = 7  # the inputs of "another path"


def test_a_dit_clone_of_a_snapshot_continues_like_a_session_that_took_that_path(replica_context):
    async def go():
        dit = _new(dit_module.DiTDeployment)
        await dit.__init__(MODEL, SessionArgs(), snapshot_mib=64)
        context = np.random.default_rng(0).standard_normal((6, dit._engine.cfg.text_dim)).astype(np.float32)
        await dit.open("a", _options("a"), context)
        for k in range(3):
            await dit.step("a", ChunkStep(*_chunk(k)))
        stats = await dit.stats()
        # copied before chunks 1 and 2 (the state before chunk 0 is an open's; the current one is live)
        assert stats["snapshots"]["held"] == 2 and stats["snapshots"]["bytes"] > 0
        assert sorted(dit.record_routing_stats()["snapshots"]) == ["a#1", "a#2"]
        await dit.clone("a#1", "b", _options("b"))  # the state after chunk 0
        await dit.close("a")  # its final state is kept; the snapshots outlive it
        assert sorted(dit.record_routing_stats()["snapshots"]) == ["a#1", "a#2", "a#3"]
        await dit.clone("a#2", "c", _options("c"))
        await dit.clone("a#3", "d", _options("d"))
        forked = [(await dit.step(sid, ChunkStep(*_chunk(OTHER)))).latents for sid in ("b", "c", "d")]
        refs = []
        for n in (1, 2, 3):
            await dit.open(f"r{n}", _options(f"r{n}"), context)
            refs.append([(await dit.step(f"r{n}", ChunkStep(*_chunk(k)))).latents for k in [*range(n), OTHER]][-1])
            await dit.close(f"r{n}")
        with pytest.raises(NoSnapshot):
            await dit.clone("a#9", "d", _options("d"))
        with pytest.raises(NoSnapshot):
            await dit.clone("nobody#1", "d", _options("d"))
        return forked, refs

    forked, refs = asyncio.run(go())
    for copy, ref in zip(forked, refs):
        np.testing.assert_array_equal(copy, ref)
    assert not np.array_equal(forked[0], forked[1])


def test_a_dit_keeps_only_what_its_snapshot_budget_holds(replica_context):
    async def go():
        dit = _new(dit_module.DiTDeployment)
        await dit.__init__(MODEL, SessionArgs(), snapshot_mib=64)
        context = np.zeros((6, dit._engine.cfg.text_dim), np.float32)
        await dit.open("a", _options("a", total_latent_frames=12), context)  # its caches do not grow
        for k in (0, 1):
            await dit.step("a", ChunkStep(*_chunk(k)))
        one = dit.snapshots.nbytes
        dit.snapshots.max_bytes = one  # room for one: each chunk's copy evicts the one before
        for k in (2, 3):
            await dit.step("a", ChunkStep(*_chunk(k)))
        return dit.record_routing_stats()["snapshots"], dit.snapshots.evictions

    held, evicted = asyncio.run(go())
    assert held == ["a#3"] and evicted == 2  # the state before the newest chunk: an undo


def test_without_a_budget_a_dit_keeps_no_snapshot(replica_context):
    async def go():
        dit = _new(dit_module.DiTDeployment)
        await dit.__init__(MODEL, SessionArgs())
        context = np.zeros((6, dit._engine.cfg.text_dim), np.float32)
        await dit.open("a", _options("a"), context)
        for k in (0, 1):
            await dit.step("a", ChunkStep(*_chunk(k)))
        await dit.close("a")
        with pytest.raises(NoSnapshot):
            await dit.clone("a#1", "b", _options("b"))
        return (await dit.stats())["snapshots"]

    assert asyncio.run(go())["held"] == 0


def test_a_vae_clone_of_a_snapshot_decodes_and_muxes_like_the_session_that_took_that_path(replica_context):
    """The VAE's encoder and decoder parts are kept apart: here chunk k + 1 is conditioned
    before chunk k is decoded (a client that sends ahead), and the copy after chunk 1 is still
    the state after exactly one condition and one decode."""
    image = np.random.default_rng(3).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    latents = [np.random.default_rng(10 + k).standard_normal((16, 3, 4, 6)).astype(np.float32) for k in range(8)]

    async def go():
        vae = _new(vae_module.VaeDeployment)
        await vae.__init__(MODEL, SessionArgs(), 8, snapshot_mib=64)
        await vae.open("a", _options("a"), image)
        await vae.condition("a")
        for k in range(3):
            await vae.condition("a")  # ahead of the decode of chunk k
            await vae.decode("a", latents[k])
        await vae.clone("a#1", "b")
        await vae.close("a")
        await vae.clone("a#3", "c")  # its final state, kept on close (conditioned 4 times, decoded 3)
        with pytest.raises(NoSnapshot):
            await vae.clone("a#4", "d")  # no decoder part after 4 decodes
        forked = [await vae.condition("b"), (await vae.decode("b", latents[OTHER]))["video"]]
        await vae.open("r", _options("r"), image)
        ref = []
        for k in (0, OTHER):
            y = await vae.condition("r")
            ref.append((y, (await vae.decode("r", latents[k]))["video"]))
        return forked, ref

    forked, ref = asyncio.run(go())
    np.testing.assert_array_equal(forked[0], ref[1][0])
    assert forked[1] == ref[1][1]  # the fragment of chunk 1, byte for byte
