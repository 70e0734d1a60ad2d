"""benchmarks/ready_split.py: replicas' ready splits placed on the time line of a `serve run`."""
from __future__ import annotations

import json

from benchmarks import ready_split

LAUNCH = 1_000_000.0


def replica(name: str, started: float, total: float, warmup: float, sizes: list) -> dict:
    ready = {"started_at": LAUNCH + started, "ready_at": LAUNCH + started + total, "total_s": total,
             "load_s": total - warmup, "warmup_s": warmup, "compile_s": sum(c for _, _, c in sizes),
             "warmup_per_size": [{"size": s, "seconds": sec, "compile_s": c} for s, sec, c in sizes],
             "compile_cache": {"dir": "/c", "fxgraph_cache_hit": 4, "fxgraph_cache_miss": 0}}
    return {"replica": name, "sessions": 0, "ready": ready}


def models() -> dict:
    return {"object": "list", "data": [{"id": "m", "replicas": {
        "text_encoder": [{"cached_prompts": 0, "ready": {"started_at": LAUNCH + 9.0, "ready_at": LAUNCH + 30.0,
                                                          "total_s": 21.0, "load_s": 20.5, "warmup_s": 0.5}}],
        "vae": [replica("v0", 10.0, 40.0, 35.0, [([464, 832], 20.0, 15.0), ([624, 624], 15.0, 11.0)])],
        "dit": [replica("d0", 11.0, 32.0, 12.0, [([464, 832], 12.0, 8.0)]), {"replica": "old", "sessions": 0}],
    }}]}


def test_a_start_is_split_on_the_launch_time_line(tmp_path):
    record = ready_split.split(models(), LAUNCH, healthy_s=55.0, label="cold")
    assert record["ray_start_s"] == 9.0  # the first constructor (the text encoder's) began 9 s in
    assert record["replicas_ready_s"] == 50.0  # the VAE, ready 10 + 40 s after the launch
    assert record["after_replicas_s"] == 5.0
    (vae,) = record["replicas"]["vae"]
    assert (vae["start_after_launch_s"], vae["ready_after_launch_s"], vae["load_s"]) == (10.0, 50.0, 5.0)
    assert [e["compile_s"] for e in vae["warmup_per_size"]] == [15.0, 11.0] and vae["compile_s"] == 26.0
    assert [r["replica"] for r in record["replicas"]["dit"]] == ["d0"]  # a replica without a split is left out
    assert "fxgraph hit/miss 4/0" in ready_split.describe(record)


def test_the_cli_writes_each_start_and_gathers_them(tmp_path):
    (tmp_path / "models.json").write_text(json.dumps(models()))
    for label, healthy in (("cold", 55.0), ("warm", 30.0)):
        ready_split.main(["--models", str(tmp_path / "models.json"), "--launched-at", str(LAUNCH),
                          "--healthy-s", str(healthy), "--label", label, "--out", str(tmp_path / f"{label}.json")])
    ready_split.main(["--combine", str(tmp_path / "cold.json"), str(tmp_path / "warm.json"),
                      "--out", str(tmp_path / "ready.json")])
    doc = json.loads((tmp_path / "ready.json").read_text())
    assert doc["healthy_s"] == {"cold": 55.0, "warm": 30.0}
    assert [s["label"] for s in doc["starts"]] == ["cold", "warm"] and doc["starts"][1]["after_replicas_s"] == -20.0


def test_a_start_from_the_stores_artefacts_shows_what_each_replica_fetched(tmp_path):
    doc = models()
    vae = doc["data"][0]["replicas"]["vae"][0]["ready"]
    vae.update(store_fetch_s=0.8, store_put_s=0.0,
               compile_store={"key": "compile/x/vae.bin", "fetched": "loaded", "loaded_bytes": 123456, "fetch_s": 0.8,
                              "published": "same", "put_bytes": 0, "put_s": 0.0, "errors": []})
    record = ready_split.split(doc, LAUNCH, healthy_s=55.0, label="store")
    (row,) = record["replicas"]["vae"]
    assert row["store_fetch_s"] == 0.8 and row["compile_store"]["fetched"] == "loaded"
    assert "compile_store" not in record["replicas"]["dit"][0]  # a replica without the store
    assert "store loaded 123456 B in 0.8 s, same 0 B" in ready_split.describe(record)
