"""A world in the store (deployments/worlds/worlds.py, chunks.py, manifest.py, journal_parts.py)
on both backends: a journal stored chunk by chunk and made back exactly; owners kept apart;
damaged parts refused; quotas and retention."""
from __future__ import annotations

import numpy as np
import pytest

from deployments.config import AppArgs
from deployments.worlds.errors import BadWorldFile, BadWorldKey, QuotaExceeded, WorldNotFound
from deployments.worlds.ids import principal_dir, world_dir
from deployments.worlds.journal_parts import journal_from_world, journal_records
from deployments.worlds.manifest import Manifest, fingerprint_changes, served_model
from deployments.worlds.worlds import Worlds
from worlds_support import VIDEOS, make_journal, save

def test_a_journal_round_trips_through_the_store(store):
    worlds = Worlds(store)
    journal, m = save(worlds)
    world = worlds.load("alice", m.world_id)
    back = journal_from_world(world, 1 << 30)
    assert np.array_equal(back.image, journal.image) and np.array_equal(back.context, journal.context)
    assert len(back.chunks) == 3 and back.steering == {1: "the lake freezes"} == journal.steering
    for a, b, na, nb in zip(journal.chunks, back.chunks, journal.noises, back.noises):
        for field in ("poses", "intrinsics", "y", "latents", "context", "kv_growth"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y)), field
        assert np.array_equal(na.rng, nb.rng) and na.whole_drawn == nb.whole_drawn
    assert back.chunks[2].y is back.chunks[1].y  # stored once, shared again as the journal shares it
    assert back.nbytes == journal.nbytes and back.recoverable
    assert back.conditioned == back.decoded == 3 and back.noise is back.noises[-1]
    assert [c.video for c in world.chunks] == VIDEOS
    assert not any(o.key.endswith("c/000002/y.npy") for o in store.list(""))
    assert world.manifest.chunks == 3 and world.manifest.prompt == "a quiet lake"
    assert m.bytes == sum(o.size for o in store.list(world_dir("alice", m.world_id)))


def test_the_manifest_says_what_a_continuation_needs(store):
    worlds = Worlds(store, clock=lambda: 1000.0)
    _, m = save(worlds, chunks=1)
    assert (m.model_id, m.dtype, m.attention, m.seed, m.height, m.width) == ("tiny", "float32", "cudnn", 7, 32, 48)
    assert m.owner == principal_dir("alice") and "alice" not in m.to_json().decode()
    assert Manifest.from_json(m.to_json()) == m
    fp8 = AppArgs.model_validate({"model": {"kv_cache": "fp8", "dtype": "bfloat16"}})
    assert fingerprint_changes(m.model, served_model(fp8)) == ["model.dtype", "model.kv_cache"]
    assert fingerprint_changes(m.model, served_model(AppArgs.model_validate({"sessions": {"max_sessions": 9}}))) == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "drop", "commit", "uncommitted"])
def test_a_damaged_part_in_the_store_is_refused_never_half_loaded(store, damage):
    worlds = Worlds(store)
    _, m = save(worlds)
    key = f"{world_dir('alice', m.world_id)}/c/000001/latents.npy"
    data = store.get(key)
    if damage == "flip":
        store.put(key, data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "truncate":
        store.put(key, data[: len(data) // 2])
    elif damage == "drop":
        store.delete(key)
    elif damage == "commit":
        store.put(f"{world_dir('alice', m.world_id)}/c/000001/chunk.json", b"{not json")
    else:  # the manifest counts 3 chunks; the store has one committed
        store.delete(f"{world_dir('alice', m.world_id)}/c/000001/chunk.json")
    with pytest.raises(BadWorldFile):
        worlds.load("alice", m.world_id)
    worlds.delete("alice", m.world_id)  # a damaged world can still be deleted
    assert store.list(principal_dir("alice")) == [] and worlds.usage("alice") == 0


def test_a_principal_sees_and_opens_only_its_own_worlds(store):
    worlds = Worlds(store)
    _, mine = save(worlds, "alice", chunks=1)
    _, theirs = save(worlds, "bob", chunks=1, title="bob's")
    assert [w.world_id for w in worlds.list("alice")] == [mine.world_id]
    for call in (worlds.load, worlds.manifest, worlds.delete):
        with pytest.raises(WorldNotFound):
            call("alice", theirs.world_id)
    for bad in ("../" + theirs.world_id, "/etc", "w" + "0" * 23, theirs.world_id.upper(), "w" + "0" * 24 + "/x"):
        with pytest.raises(BadWorldKey):
            worlds.load("alice", bad)
    worlds.delete("alice", mine.world_id)
    assert worlds.list("alice") == [] and [w.world_id for w in worlds.list("bob")] == [theirs.world_id]
    assert worlds.usage("alice") == 0


def test_the_quota_refuses_a_write_before_any_byte(store):
    probe = Worlds(store)
    _, m = save(probe, "probe", chunks=2)
    two_chunks = m.bytes
    worlds = Worlds(store, quota_bytes=two_chunks + 100)
    journal, m = save(worlds, "alice", chunks=2)
    before = [(o.key, o.size) for o in store.list(principal_dir("alice"))]
    record = journal_records(make_journal(3))[2]
    with pytest.raises(QuotaExceeded):
        worlds.put_chunk("alice", m.world_id, record, journal.chunks[1].y)
    assert [(o.key, o.size) for o in store.list(principal_dir("alice"))] == before
    assert worlds.usage("alice") == sum(s for _, s in before) == worlds.manifest("alice", m.world_id).bytes
    save(worlds, "bob", chunks=2)  # another principal's own quota
    worlds.delete("alice", m.world_id)
    save(worlds, "alice", chunks=2)


def test_a_retried_chunk_counts_once(store):
    worlds = Worlds(store)
    journal, m = save(worlds, chunks=2)
    record = journal_records(journal)[1]
    m2 = worlds.put_chunk("alice", m.world_id, record, journal.chunks[0].y)
    assert m2.chunks == 2 and worlds.usage("alice") == m2.bytes == sum(o.size for o in store.list("p"))
    assert Worlds(store).usage("alice") == m2.bytes  # counted afresh from the store


def test_a_chunk_written_again_below_the_head_ends_the_world_there(store):
    """A rewound session's next chunk replaces the old branch: the world is as long as that chunk says."""
    worlds = Worlds(store)
    journal, m = save(worlds, chunks=3)
    other = journal_records(make_journal(3, seed=5))[1]
    m2 = worlds.put_chunk("alice", m.world_id, other, journal.chunks[0].y)
    world = worlds.load("alice", m.world_id)
    assert m2.chunks == 2 and len(world.chunks) == 2
    assert np.array_equal(world.chunks[1].past.latents, other.past.latents)
    assert not any("/c/000002/" in o.key for o in store.list(""))
    assert m2.bytes == sum(o.size for o in store.list("p")) == worlds.usage("alice")


def test_retention_deletes_worlds_not_updated_for_its_time(store):
    now = [1000.0]
    worlds = Worlds(store, retention_s=3600, clock=lambda: now[0])
    _, old = save(worlds, "alice", chunks=1)
    _, kept = save(worlds, "bob", chunks=1)
    now[0] += 3000
    worlds.put_chunk("bob", kept.world_id, journal_records(make_journal(2))[1])  # bob's world is updated
    now[0] += 1000
    assert worlds.sweep() == [world_dir("alice", old.world_id)]
    assert worlds.list("alice") == [] and len(worlds.list("bob")) == 1
    assert store.list(principal_dir("alice")) == []
    assert Worlds(store).sweep() == []  # no retention: nothing goes
