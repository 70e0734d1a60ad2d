"""`.lwf` export and import (deployments/worlds/lwf.py) on both backends: a world moves whole
to another principal; a corrupt, truncated, oversized or hostile file, a full quota or a store
failing mid-import leave nothing behind."""
from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest

from deployments.worlds.errors import BadWorldFile, QuotaExceeded, StoreUnavailable
from deployments.worlds.ids import principal_dir
from deployments.worlds.lwf import PREAMBLE, export_world, import_world
from deployments.worlds.worlds import Worlds
from worlds_support import save

LIMIT = 64 << 20


def exported(worlds: Worlds) -> tuple[bytes, str]:
    _, m = save(worlds, "alice")
    out = io.BytesIO()
    n = export_world(worlds, "alice", m.world_id, out)
    assert n == len(out.getvalue())
    return out.getvalue(), m.world_id


def nothing_of_bob(store, worlds: Worlds) -> None:
    assert worlds.list("bob") == [] and store.list(principal_dir("bob")) == [] and worlds.usage("bob") == 0


def test_a_world_moves_whole_to_another_principal(store):
    worlds = Worlds(store)
    data, wid = exported(worlds)
    m = import_world(worlds, "bob", io.BytesIO(data), LIMIT)
    assert m.world_id != wid and m.owner == principal_dir("bob") and m.chunks == 3
    a, b = worlds.load("alice", wid), worlds.load("bob", m.world_id)
    assert np.array_equal(a.image, b.image) and np.array_equal(a.context, b.context)
    for x, y in zip(a.chunks, b.chunks):
        assert x.video == y.video and x.prompt == y.prompt and np.array_equal(x.noise.rng, y.noise.rng)
        assert all(np.array_equal(getattr(x.past, f), getattr(y.past, f)) for f in ("poses", "y", "latents"))
    assert b.chunks[2].past.y is b.chunks[1].past.y
    assert m.fingerprint == a.manifest.fingerprint and m.title == a.manifest.title
    assert worlds.usage("bob") == m.bytes
    out = io.BytesIO()
    export_world(worlds, "bob", m.world_id, out)  # the same world exports to the same parts
    assert header(out.getvalue())["parts"] == header(data)["parts"]


def header(data: bytes) -> dict:
    n = int.from_bytes(data[12:16], "little")
    return json.loads(data[PREAMBLE.size:PREAMBLE.size + n])


def damaged(data: bytes) -> dict[str, bytes]:
    header_end = PREAMBLE.size + int.from_bytes(data[12:16], "little")
    flips = {"magic": 0, "version": 8, "header length": 13, "header digest": 20, "header": PREAMBLE.size + 5,
             "first part": header_end + 10, "middle": (header_end + len(data)) // 2, "last byte": len(data) - 1}
    out = {f"flip {name}": data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:] for name, i in flips.items()}
    out |= {f"cut at {f:.2f}": data[: int(len(data) * f)] for f in (0.0, 0.01, 0.2, 0.5, 0.9, 0.999)}
    out["one byte more"] = data + b"\x00"
    return out


def test_a_corrupt_or_truncated_file_is_refused_and_nothing_is_loaded(store):
    worlds = Worlds(store)
    data, _ = exported(worlds)
    for name, bad in damaged(data).items():
        with pytest.raises(BadWorldFile):
            import_world(worlds, "bob", io.BytesIO(bad), LIMIT)
            pytest.fail(name)
    nothing_of_bob(store, worlds)


class Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        out = super().read(n)
        self.read_bytes += len(out)
        return out


def test_an_oversized_file_is_refused_before_its_body_is_read(store):
    worlds = Worlds(store)
    data, _ = exported(worlds)
    src = Counting(data)
    with pytest.raises(BadWorldFile, match="import limit"):
        import_world(worlds, "bob", src, len(data) - 1)
    assert src.read_bytes < len(data) // 4
    nothing_of_bob(store, worlds)


def forged(data: bytes, edit) -> bytes:
    """The file with its header edited and its digest made to match (a hostile file, not a damaged one)."""
    n = int.from_bytes(data[12:16], "little")
    h = header(data)
    edit(h)
    raw = json.dumps(h).encode()
    body = data[PREAMBLE.size + n:]
    return PREAMBLE.pack(b"LWFWORLD", 1, len(raw), hashlib.sha256(raw).digest()) + raw + body


@pytest.mark.parametrize("edit", [
    lambda h: h["parts"][0].__setitem__(0, "../../escape"),
    lambda h: h["parts"][0].__setitem__(0, "/etc/passwd"),
    lambda h: h["parts"][1].__setitem__(0, "manifest.json"),
    lambda h: h["manifest"].__setitem__("chunks", 4),
    lambda h: h["manifest"].__setitem__("seed", "7"),
    lambda h: h["manifest"]["model"].__setitem__("dtype", "bfloat16"),  # no longer its fingerprint
    lambda h: h["parts"].__setitem__(0, h["parts"][0][:2] + ["0" * 64]),
])
def test_a_forged_header_is_refused(store, edit):
    worlds = Worlds(store)
    data, _ = exported(worlds)
    with pytest.raises(BadWorldFile):
        import_world(worlds, "bob", io.BytesIO(forged(data, edit)), LIMIT)
    nothing_of_bob(store, worlds)


def test_a_full_quota_refuses_the_import_whole(store):
    data, _ = exported(Worlds(store))
    worlds = Worlds(store, quota_bytes=len(data) // 2)
    with pytest.raises(QuotaExceeded):
        import_world(worlds, "bob", io.BytesIO(data), LIMIT)
    nothing_of_bob(store, worlds)


def test_a_store_failing_mid_import_leaves_nothing(store, monkeypatch):
    worlds = Worlds(store)
    data, _ = exported(worlds)
    puts = []
    real = type(store)._put

    def failing(self, key, value):
        puts.append(key)
        if len(puts) == 6:
            raise StoreUnavailable("down")
        real(self, key, value)

    monkeypatch.setattr(type(store), "_put", failing)
    with pytest.raises(StoreUnavailable):
        import_world(worlds, "bob", io.BytesIO(data), LIMIT)
    monkeypatch.undo()
    nothing_of_bob(store, worlds)
