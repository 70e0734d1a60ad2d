"""benchmarks/worlds/store.py runs through on a local folder at a small size and says what it measured."""
from __future__ import annotations

import json

from benchmarks.worlds.store import main


def test_the_world_store_benchmark_runs_on_a_local_folder(tmp_path):
    out = tmp_path / "r.json"
    main(["--root", str(tmp_path / "w"), "--size", "32*48", "--chunks", "4", "--open", "2,4", "--repeats", "1",
          "--video-kib", "1", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["chunks"] == 4 and set(r["open_s"]) == {"2", "4"} and r["write_s"]["p95"] >= r["write_s"]["p50"] > 0
    # the second chunk stores its own y; from the third on y repeats and is stored once
    assert r["bytes_per_chunk"]["second"] > r["bytes_per_chunk"]["median"] > 16 * 3 * 4 * 6 * 4 + 1024
    assert list((tmp_path / "w").rglob("*.npy")) == []  # the benchmark's worlds are deleted
