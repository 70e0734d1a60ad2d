"""The benchmark serve configs are overlays of the shipped ones (benchmarks/overlay.py)."""
from __future__ import annotations

import pytest

from ray.serve.schema import ServeDeploySchema

from deployments.config import AppArgs
from serve_graph import the_app
from support import REPO

BENCHMARK_CONFIGS = sorted(p.name for p in (REPO / "benchmarks").glob("serve_config.*.yaml"))


@pytest.mark.parametrize("name", BENCHMARK_CONFIGS)
def test_every_benchmark_config_is_an_overlay_of_a_shipped_one(name):
    """Issue 45 item 5: a benchmark config names only what differs (benchmarks/overlay.py): its
    `base:` is a shipped serve config, or a benchmark overlay whose chain ends at one; the
    resolved config validates like any other."""
    import yaml

    from benchmarks.overlay import resolve

    path, seen = f"benchmarks/{name}", []
    while True:
        doc = yaml.safe_load((REPO / path).read_text())
        if "base" not in doc:
            break
        assert set(doc) <= {"base", "config", "args"} and path not in seen, path
        seen.append(path)
        path = doc["base"]
    assert seen and not path.startswith("benchmarks/"), (name, path)  # a shipped config at the root
    assert (REPO / path).parent == REPO and path.startswith("serve_config"), path
    cfg = resolve(REPO / f"benchmarks/{name}")
    ServeDeploySchema.model_validate(cfg)
    AppArgs.model_validate(the_app(cfg)["args"])


def test_an_overlay_changes_the_config_outside_the_args_through_config(tmp_path):
    from benchmarks.overlay import resolve

    overlay = tmp_path / "o.yaml"
    overlay.write_text("base: serve_config.gpu.yaml\nconfig:\n  http_options: {host: 127.0.0.1}\n"
                       "args:\n  sessions: {max_sessions: 3}\n")
    cfg, base = resolve(overlay), resolve(REPO / "serve_config.gpu.yaml")
    assert cfg["http_options"] == {**base["http_options"], "host": "127.0.0.1"}
    assert the_app(cfg)["args"]["sessions"]["max_sessions"] == 3
    assert the_app(cfg)["args"]["model"] == the_app(base)["args"]["model"]
    overlay.write_text("base: serve_config.gpu.yaml\nconfig:\n  applications: []\n")
    with pytest.raises(ValueError, match="args"):
        resolve(overlay)
