"""Replicas that start warm from the store (issue 55 item 5), on the CPU with the tiny model and
inductor: a DiT or VAE replica (its constructor as Serve runs it, without Ray) compiles and puts
its compile artefacts in the world store (a local folder); a replica on a "fresh node" (an empty
compile cache directory of its own, a new process) loads them before compiling and reports
inductor cache hits in its ready split; a corrupt artefact in the store costs a compile, never
the start. Each start is a process of its own: dynamo's and inductor's in-memory caches must
not carry over (slow: one compile of one small size bucket each, tests/conftest.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deployments.config import ModelArgs
from deployments.worlds.compile_artifacts import artifact_facts, artifact_key, unframe
from deployments.worlds.local import LocalStore
from model.accel import AccelOptions
from model.compile_cache import INDUCTOR_ENV, TRITON_ENV
from support import REPO

MODEL = ModelArgs(preset="tiny", device="cpu", warmup=True, size_buckets=["32*48"], default_size="32*48",
                  vae_compile=True)

SCRIPT = """
import asyncio, json, sys, types
from deployments.config import ModelArgs, SessionArgs
from deployments.replicas import dit, session_host, vae
from deployments.worlds_args import WorldsArgs
ctx = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="r"))
session_host.serve.get_replica_context = lambda: ctx
name, model, store = sys.argv[1], ModelArgs.model_validate_json(sys.argv[2]), WorldsArgs.model_validate_json(sys.argv[3])

async def start():
    cls = (vae.VaeDeployment if name == "vae" else dit.DiTDeployment).func_or_class
    replica = cls.__new__(cls)
    await (replica.__init__(model, SessionArgs(), 4, store=store) if name == "vae"
           else replica.__init__(model, SessionArgs(), store=store))
    return (await replica.stats())["ready"]

print(json.dumps(asyncio.run(start())))
"""


def start(name: str, cache_dir: Path, store_root: Path, model: ModelArgs = MODEL) -> dict:
    """One replica's start in a fresh process: its ready split."""
    model = model.model_copy(update={"compile_cache_dir": str(cache_dir), "compile": name == "dit"})
    store = {"root": str(store_root), "compile_artifacts": True}
    env = {k: v for k, v in os.environ.items() if k not in (INDUCTOR_ENV, TRITON_ENV)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, name, model.model_dump_json(), json.dumps(store)],
                         cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_vae_replica_on_a_fresh_node_loads_what_the_first_put(tmp_path):
    first = start("vae", tmp_path / "node-a", tmp_path / "store")
    assert first["compile_store"]["fetched"] == "absent" and first["compile_store"]["published"] == "put"
    assert first["compile_cache"]["fxgraph_cache_miss"] >= 1 and first["compile_cache"]["fxgraph_cache_hit"] == 0
    (stored,) = [o for o in LocalStore(tmp_path / "store").list("compile")]
    assert stored.key == first["compile_store"]["key"] and stored.key.endswith("/vae.bin")
    assert len(unframe(LocalStore(tmp_path / "store").get(stored.key))) == first["compile_store"]["put_bytes"] > 0
    fresh = start("vae", tmp_path / "node-b", tmp_path / "store")  # its own, empty compile cache
    cache, store = fresh["compile_cache"], fresh["compile_store"]
    assert cache["mega_loaded_bytes"] == 0 and cache["hot_loaded_bytes"] == {"store": store["loaded_bytes"]}
    assert store["fetched"] == "loaded" and store["loaded_bytes"] == first["compile_store"]["put_bytes"]
    assert cache["fxgraph_cache_hit"] >= 1 and cache["fxgraph_cache_miss"] == 0 and not cache["errors"]
    assert store["published"] == "same" and not store["errors"]
    assert fresh["store_fetch_s"] >= store["fetch_s"] >= 0 and "store_put_s" in fresh


def test_a_dit_replica_on_a_fresh_node_loads_what_the_first_put(tmp_path):
    first = start("dit", tmp_path / "node-a", tmp_path / "store")
    assert first["compile_store"]["published"] == "put" and first["compile_store"]["key"].endswith("/dit.bin")
    fresh = start("dit", tmp_path / "node-b", tmp_path / "store")
    assert fresh["compile_store"]["fetched"] == "loaded" and fresh["compile_cache"]["mega_loaded_bytes"] == 0
    assert fresh["compile_cache"]["fxgraph_cache_hit"] >= 1 and fresh["compile_cache"]["fxgraph_cache_miss"] == 0


def test_a_corrupt_artefact_in_the_store_costs_a_compile_not_the_start(tmp_path):
    options = AccelOptions.for_serving("cpu", vae_compile=True)
    model = MODEL.model_copy(update={"compile_cache_dir": str(tmp_path / "node")})  # as `start` gives it
    key = artifact_key("vae", artifact_facts("vae", model, options))
    store = LocalStore(tmp_path / "store")
    store.put(key, b"LWFCOMPILE1\n" + b"0" * 64 + b"\n" + b"bytes a disk or a bucket mangled")
    ready = start("vae", tmp_path / "node", tmp_path / "store")
    assert ready["compile_store"]["key"] == key and ready["compile_store"]["fetched"] == "bad"
    assert ready["compile_store"]["errors"][0].startswith("fetch: ValueError: checksum mismatch")
    assert ready["compile_cache"]["fxgraph_cache_miss"] >= 1 and ready["warmup_per_size"][0]["size"] == [32, 48]
    assert ready["compile_store"]["published"] == "put"  # the good artefact replaces the corrupt one
    assert len(unframe(store.get(key))) == ready["compile_store"]["put_bytes"] > 0
