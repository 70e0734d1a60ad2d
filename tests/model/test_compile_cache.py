"""model/compile_cache.py: what one process compiles, the next one loads (on the CPU's inductor)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from model.compile_cache import INDUCTOR_ENV, TRITON_ENV, CompileCache
from support import REPO

# A fresh process each time: dynamo's and inductor's in-memory caches must not carry over.
SCRIPT = """
import json, sys, torch
from model.compile_cache import CompileCache
cache = CompileCache.open(sys.argv[1], "probe")
hot = cache.hot_load(open(sys.argv[2], "rb").read(), "store") if len(sys.argv) > 2 else None
f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos() * x)
y = f(torch.arange(8.0))
cache.save()
print(json.dumps({**cache.stats(), "y": y.tolist(), "hot": hot, "artifact": len(cache.artifact())}))
"""


def start(directory, *hot_load) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (INDUCTOR_ENV, TRITON_ENV)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(directory), *map(str, hot_load)], cwd=REPO, env=env,
                         check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_second_start_loads_what_the_first_compiled(tmp_path):
    cold = start(tmp_path / "cache")
    assert cold["fxgraph_cache_miss"] >= 1 and cold["fxgraph_cache_hit"] == 0
    assert cold["mega_loaded_bytes"] == 0 and cold["mega_saved_bytes"] > 0 and not cold["errors"]
    assert (tmp_path / "cache" / "mega" / "probe.bin").stat().st_size == cold["mega_saved_bytes"]
    assert any((tmp_path / "cache" / "inductor").rglob("*.py"))  # the generated code
    warm = start(tmp_path / "cache")
    assert warm["fxgraph_cache_hit"] >= 1 and warm["fxgraph_cache_miss"] == 0
    assert warm["mega_loaded_bytes"] == cold["mega_saved_bytes"] and not warm["errors"]
    x = torch.arange(8.0)
    expected = torch.sin(x) * 2 + x.cos() * x
    assert torch.allclose(torch.tensor(warm["y"]), expected) and warm["y"] == cold["y"]


def test_artefacts_hot_loaded_from_elsewhere_are_cache_hits(tmp_path):
    """What the world store hands a replica on a fresh node (deployments/worlds/compile_artifacts.py):
    another process's blob, loaded into an empty cache directory before anything compiles."""
    first = start(tmp_path / "node-a")
    blob = tmp_path / "node-a" / "mega" / "probe.bin"
    assert first["artifact"] == first["mega_saved_bytes"] == blob.stat().st_size > 0  # artifact() is what save wrote
    fresh = start(tmp_path / "node-b", blob)
    assert fresh["hot"] is True and fresh["hot_loaded_bytes"] == {"store": first["mega_saved_bytes"]}
    assert fresh["mega_loaded_bytes"] == 0 and fresh["fxgraph_cache_hit"] >= 1 and fresh["fxgraph_cache_miss"] == 0
    assert fresh["y"] == first["y"] and not fresh["errors"]
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"framed elsewhere, not torch's")
    cold = start(tmp_path / "node-c", junk)
    assert cold["hot"] is False and cold["hot_loaded_bytes"] == {} and cold["errors"][0].startswith("store:")
    assert cold["fxgraph_cache_miss"] >= 1 and cold["y"] == first["y"]  # compiled as if cold


def test_without_a_directory_the_artefact_is_still_made(monkeypatch):
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    cache = CompileCache.open(None, "probe")
    assert cache.save() == 0 and isinstance(cache.artifact(), bytes)  # torch's blob of this process, maybe empty


def test_a_torn_mega_cache_file_is_compiled_over(tmp_path):
    (tmp_path / "mega").mkdir()
    (tmp_path / "mega" / "probe.bin").write_bytes(b"not a cache")
    run = start(tmp_path)
    assert run["mega_loaded_bytes"] == 0 and run["errors"] and run["errors"][0].startswith("load:")
    assert run["fxgraph_cache_miss"] >= 1 and run["mega_saved_bytes"] > 0  # compiled and saved anew


def test_an_unusable_directory_leaves_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = CompileCache.open(blocker / "cache", "dit")
    assert cache.directory is None and cache.errors and INDUCTOR_ENV not in os.environ
    assert cache.save() == 0 and cache.stats()["dir"] is None


def test_no_directory_is_torchs_default(monkeypatch):
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    cache = CompileCache.open(None, "dit")
    assert cache.directory is None and not cache.errors and INDUCTOR_ENV not in os.environ
