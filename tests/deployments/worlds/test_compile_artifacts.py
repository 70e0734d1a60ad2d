"""deployments/worlds/compile_artifacts.py: a replica's compile artefacts in the store, on both
backends (a local folder; SeaweedFS through obstore), with a stand-in for the replica's
CompileCache (what torch loads is tests/model/test_compile_cache.py's and
tests/deployments/test_warm_start.py's): what is fetched, what is put, and that nothing a store or
an artefact does fails a start."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pytest
from ray.serve import Application

from deployments.config import AppArgs, ModelArgs
from deployments.worlds import compile_artifacts as ca
from deployments.worlds.compile_artifacts import (HEADER_BYTES, MAGIC, StoreArtifacts, artifact_facts, artifact_key,
                                                  frame, open_artifacts, replica_artifacts, unframe)
from deployments.worlds.errors import StoreUnavailable
from deployments.worlds.store import ObjectInfo, WorldStore
from deployments.worlds_args import WorldsArgs
import model.compile_cache as mcc
from model.accel import AccelOptions

KEY = "compile/0123456789abcdef0123456789abcdef/vae.bin"
BLOB = b"torch artefacts " * 64


@dataclass
class FakeCache:
    """What StoreArtifacts uses of a CompileCache: its local load, a hot load, its blob, its misses."""

    loaded_bytes: int = 0
    blob: bytes = BLOB
    loadable: bool = True
    misses: int = 0
    hot: list[bytes] = field(default_factory=list)

    def hot_load(self, data: bytes, source: str) -> bool:
        self.hot.append(data)
        return self.loadable

    def artifact(self) -> bytes:
        return self.blob

    def stats(self) -> dict:
        return {"fxgraph_cache_miss": self.misses}


class DownStore(WorldStore):
    """A store that answers nothing (down, refusing, timing out)."""

    def _put(self, *args):
        raise StoreUnavailable("down")

    _get = _list = _delete = _put


def test_a_fresh_replica_loads_what_the_first_put(store):
    first = StoreArtifacts(store, KEY, 1 << 20)
    cold = FakeCache(misses=3)
    assert first.fetch(cold) is False and first.fetched == "absent" and cold.hot == []
    first.publish(cold)
    assert first.published == "put" and first.put_bytes == len(BLOB) and not first.errors
    assert unframe(store.get(KEY)) == BLOB and store.get(KEY).startswith(MAGIC)
    second = StoreArtifacts(store, KEY, 1 << 20)
    fresh = FakeCache()
    assert second.fetch(fresh) is True and fresh.hot == [BLOB]
    assert second.stats()["fetched"] == "loaded" and second.loaded_bytes == len(BLOB) and not second.errors
    second.publish(fresh)  # loaded and nothing compiled anew: nothing put
    assert second.published == "same" and second.put_bytes == 0


def test_a_replica_that_loaded_but_compiled_more_puts_its_larger_artefact(store):
    store.put(KEY, frame(BLOB))
    artifacts = StoreArtifacts(store, KEY, 1 << 20)
    assert artifacts.fetch(FakeCache())
    artifacts.publish(FakeCache(blob=BLOB + b"a size more", misses=1))
    assert artifacts.published == "put" and unframe(store.get(KEY)) == BLOB + b"a size more"


@pytest.mark.parametrize("damage", ["flipped", "truncated", "not_framed", "empty"])
def test_a_corrupt_artefact_is_not_loaded_and_is_replaced(store, damage):
    good = frame(BLOB)
    stored = {"flipped": good[:-5] + bytes([good[-5] ^ 1]) + good[-4:], "truncated": good[:len(good) // 2],
              "not_framed": BLOB, "empty": b""}[damage]
    store.put(KEY, stored)
    artifacts = StoreArtifacts(store, KEY, 1 << 20)
    cache = FakeCache(misses=2)
    assert artifacts.fetch(cache) is False and cache.hot == []  # torch never sees the bytes
    assert artifacts.fetched == "bad" and len(artifacts.errors) == 1 and artifacts.errors[0].startswith("fetch:")
    artifacts.publish(cache)  # compiled: the good artefact replaces the bad one
    assert artifacts.published == "put" and unframe(store.get(KEY)) == BLOB


def test_an_artefact_torch_cannot_load_compiles_cold(store):
    store.put(KEY, frame(b"framed, but not torch's"))
    artifacts = StoreArtifacts(store, KEY, 1 << 20)
    cache = FakeCache(loadable=False, misses=1)
    assert artifacts.fetch(cache) is False and artifacts.fetched == "unloadable" and artifacts.loaded_bytes == 0
    artifacts.publish(cache)
    assert artifacts.published == "put" and unframe(store.get(KEY)) == BLOB


def test_the_size_bound_holds_both_ways(store):
    store.put(KEY, frame(b"x" * 2000))
    artifacts = StoreArtifacts(store, KEY, 1000)
    reads = []
    real_get = store.get
    store.get = lambda key: reads.append(key) or real_get(key)
    cache = FakeCache(blob=b"y" * 1001)
    assert artifacts.fetch(cache) is False and artifacts.fetched == "too_large" and reads == []  # refused unread
    artifacts.publish(cache)
    assert artifacts.published == "too_large" and unframe(real_get(KEY)) == b"x" * 2000  # nothing put
    assert [e.split(":")[0] for e in artifacts.errors] == ["fetch", "publish"]


def test_a_replica_warm_from_its_local_cache_fills_an_empty_store_once(store):
    local = FakeCache(loaded_bytes=len(BLOB))
    first = StoreArtifacts(store, KEY, 1 << 20)
    assert first.fetch(local) is False and first.fetched == "local_cache" and local.hot == []  # no store read
    first.publish(local)
    assert first.published == "put" and unframe(store.get(KEY)) == BLOB
    again = StoreArtifacts(store, KEY, 1 << 20)
    again.fetch(local)
    again.publish(FakeCache(loaded_bytes=1, blob=b"another blob"))
    assert again.published == "present" and unframe(store.get(KEY)) == BLOB


def test_a_store_that_is_down_never_fails_a_start(caplog):
    artifacts = StoreArtifacts(DownStore(), KEY, 1 << 20)
    cache = FakeCache(misses=1)
    assert artifacts.fetch(cache) is False and artifacts.fetched == "unavailable"
    artifacts.publish(cache)
    assert artifacts.published == "unavailable"
    stats = artifacts.stats()
    assert [e.split(":")[0] for e in stats["errors"]] == ["fetch", "publish"]
    assert len([r for r in caplog.records if "compile artefact" in r.getMessage()]) == 2  # one line each


def test_a_store_that_cannot_be_opened_is_counted_not_raised(monkeypatch, tmp_path):
    def broken(args):
        raise ImportError("no module named obstore")

    monkeypatch.setattr(ca, "open_store", broken)
    artifacts = open_artifacts(WorldsArgs(root=str(tmp_path), compile_artifacts=True), "dit", {"a": 1})
    cache = FakeCache(misses=1)
    assert artifacts.store is None and artifacts.errors[0].startswith("open: ImportError")
    assert artifacts.fetch(cache) is False and artifacts.fetched == "unavailable"
    artifacts.publish(cache)
    assert artifacts.published == "unavailable"


def test_the_store_keeps_artefacts_only_when_asked(tmp_path):
    model, options = ModelArgs(), AccelOptions()
    assert replica_artifacts(None, "dit", model, options) is None
    assert replica_artifacts(WorldsArgs(root=str(tmp_path)), "dit", model, options) is None
    on = replica_artifacts(WorldsArgs(root=str(tmp_path), compile_artifacts=True, compile_artifact_max_mib=2),
                           "dit", model, options)
    assert on is not None and on.max_bytes == 2 << 20 and on.key.startswith("compile/") and on.key.endswith("/dit.bin")
    assert on.key == artifact_key("dit", artifact_facts("dit", model, options))


def test_the_key_changes_with_what_invalidates_an_artefact(monkeypatch):
    model, options = ModelArgs(), AccelOptions()
    base = artifact_key("vae", artifact_facts("vae", model, options))
    same = [model.model_copy(update={"compile_cache_dir": "/elsewhere", "prompt_cache_size": 3, "warmup": False})]
    assert {artifact_key("vae", artifact_facts("vae", m, options)) for m in same} == {base}
    other = {
        "deployment": artifact_key("dit", artifact_facts("dit", model, options)),
        "parallel": artifact_key("vae", artifact_facts("vae", model, options, parallel=2)),
        "dtype": artifact_key("vae", artifact_facts("vae", model.model_copy(update={"vae_dtype": "bfloat16"}), options)),
        "sizes": artifact_key("vae", artifact_facts("vae", model.model_copy(update={"size_buckets": ["32*48"]}),
                                                    options)),
        "accel": artifact_key("vae", artifact_facts("vae", model, AccelOptions(vae_compile=True))),
    }
    for fact, value in (("torch", "9.9.9"), ("cpu_capability", "DEFAULT"), ("gpu", "NVIDIA H200")):
        real = mcc.toolchain  # artifact_facts imports it when called
        with monkeypatch.context() as m:
            m.setattr(mcc, "toolchain", lambda device, _f=fact, _v=value: {**real(device), _f: _v})
            other[fact] = artifact_key("vae", artifact_facts("vae", model, options))
    assert base not in other.values() and len(set(other.values())) == len(other), other


def test_framing_round_trip_and_header():
    data = frame(BLOB)
    assert len(data) == HEADER_BYTES + len(BLOB)
    assert data[len(MAGIC):HEADER_BYTES - 1] == hashlib.sha256(BLOB).hexdigest().encode()
    assert unframe(data) == BLOB and unframe(frame(b"")) == b""


def test_listing_a_key_never_reads_a_neighbour(tmp_path):
    """A key's listing is its folder: another deployment's artefact beside it is not taken for it."""
    class Listed(WorldStore):
        def _list(self, prefix):
            return [ObjectInfo(KEY.replace("vae", "dit"), 10, 0.0)]

        def _get(self, *args):
            raise AssertionError("read without a listing")

        _put = _delete = _get

    artifacts = StoreArtifacts(Listed(), KEY, 1 << 20)
    assert artifacts.fetch(FakeCache()) is False and artifacts.fetched == "absent"


def test_the_app_hands_the_store_to_the_dit_and_vae_replicas():
    """build_app binds `worlds` into both compiling deployments (one GPU or sequence parallel)."""
    from deployments.app import build_app

    for parallel in (1, 2):
        args = AppArgs(worlds=WorldsArgs(backend="s3", bucket="b", compile_artifacts=True), dit_parallel=parallel)
        stack, found = [build_app(args)], {}
        while stack:
            d = stack.pop()._bound_deployment
            found[d.name] = d
            stack += [a for a in (*d.init_args, *d.init_kwargs.values()) if isinstance(a, Application)]
        for name in ("DiTDeployment", "VaeDeployment"):
            assert found[name].init_kwargs == {"store": args.worlds}, (parallel, name)
        assert "store" not in found["TextEncoderDeployment"].init_kwargs  # it compiles nothing
