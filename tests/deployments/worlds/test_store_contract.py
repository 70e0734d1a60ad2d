"""The WorldStore contract (deployments/worlds/store.py) on both backends: a local folder and a
real S3 server (SeaweedFS through obstore)."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from deployments.worlds.errors import BadWorldKey, StoreUnavailable, WorldNotFound
from deployments.worlds.ids import principal_dir
from deployments.worlds.local import LocalStore
from seaweed import SeaweedServer, s3_store


def test_put_get_list_delete(store):
    store.put("a/b/one", b"1")
    store.put("a/b/two", b"22")
    store.put("a/c", b"333")
    store.put("ab/x", b"other prefix")
    assert store.get("a/b/two") == b"22"
    assert [(o.key, o.size) for o in store.list("a")] == [("a/b/one", 1), ("a/b/two", 2), ("a/c", 3)]
    assert [o.key for o in store.list("a/b")] == ["a/b/one", "a/b/two"]
    store.put("a/b/one", b"replaced")
    assert store.get("a/b/one") == b"replaced"
    store.delete("a/b/one")
    store.delete("a/b/one")  # absent: no error
    with pytest.raises(WorldNotFound):
        store.get("a/b/one")
    assert store.delete_prefix("a") == 2
    assert [o.key for o in store.list("")] == ["ab/x"]


def test_a_reader_never_sees_half_an_object(store):
    """Readers polling while a large object is written see nothing or all of it."""
    old, new = b"o" * (4 << 20), b"n" * (4 << 20)
    store.put("big", old)
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            data = store.get("big")
            seen.add("old" if data == old else "new" if data == new else f"torn {len(data)}")

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    for _ in range(4):
        store.put("big", new)
        store.put("big", old)
    stop.set()
    for r in readers:
        r.join()
    assert seen <= {"old", "new"} and seen


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", ".tmp-x", "a/.hidden",
                                 "a\\b", "a b", "é", "a/b/", "", "x" * 1100, "a\x00b"])
def test_keys_outside_the_alphabet_are_refused_before_the_backend(store, key):
    with pytest.raises(BadWorldKey):
        store.put(key, b"x")
    with pytest.raises(BadWorldKey):
        store.get(key)
    with pytest.raises(BadWorldKey):
        store.delete(key)
    assert store.list("") == []


@pytest.mark.parametrize("prefix", ["/", "/etc/", "../", "a//", ".tmp-x/"])
def test_a_listing_outside_the_alphabet_is_refused(store, prefix):
    with pytest.raises(BadWorldKey):
        store.list(prefix)


def test_a_principal_lives_under_its_digest_only(store):
    a, b = principal_dir("key-A"), principal_dir("key-B")
    assert a != b and "key-A" not in a and a.startswith("p/") and len(a) == 2 + 32
    store.put(f"{a}/w/one", b"1")
    store.put(f"{b}/w/two", b"2")
    assert [o.key for o in store.list(a)] == [f"{a}/w/one"]


def test_a_failed_local_write_leaves_nothing_visible(tmp_path, monkeypatch):
    """The rename is what makes the object visible; a write that fails before it leaves no
    object and no temporary file behind."""
    store = LocalStore(tmp_path)
    store.put("w/x", b"old")

    def fail(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StoreUnavailable):
        store.put("w/x", b"new and half written")
    with pytest.raises(StoreUnavailable):
        store.put("w/y", b"new")
    monkeypatch.undo()
    assert store.get("w/x") == b"old"
    assert [o.key for o in store.list("")] == ["w/x"]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["x"]


def test_an_s3_endpoint_that_never_answers_is_store_unavailable(s3_credentials):
    """A store that accepts connections and never replies: the request times out (timeout_s,
    one retry) instead of holding the writer's thread."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        from deployments.worlds.s3 import S3WorldStore

        store = S3WorldStore("b", endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5,
                             access_key_env="LWF_TEST_S3_KEY", secret_key_env="LWF_TEST_S3_SECRET")
        errors = []
        t = threading.Thread(target=lambda: errors.append(pytest.raises(StoreUnavailable, store.put, "k", b"v")))
        t.start()
        t.join(60)
        assert not t.is_alive() and len(errors) == 1


def test_a_stopped_s3_server_is_store_unavailable(tmp_path, s3_credentials):
    server = SeaweedServer(tmp_path)
    server.start()
    store = s3_store(server, timeout_s=2.0)
    store.put("k", b"v")
    server.stop()
    with pytest.raises(StoreUnavailable):
        store.put("k2", b"v")
    with pytest.raises(StoreUnavailable):
        store.get("k")
    server.start()
    assert store.get("k") == b"v"
    server.stop()
