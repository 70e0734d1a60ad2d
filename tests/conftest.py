"""Shared fixtures: the read-only `../shared` folder beside the checkout."""
from __future__ import annotations

from pathlib import Path

import pytest

from support import EXAMPLES, SHARED, TINY_CKPT, load_golden


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found at {SHARED}; set LWF_SHARED")
    return SHARED


@pytest.fixture(scope="session")
def tiny_ckpt(shared_dir) -> Path:
    return TINY_CKPT


@pytest.fixture(scope="session")
def examples_dir(shared_dir) -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def golden00(shared_dir) -> dict:
    return load_golden("tiny_00.pt")


# The tiers (issue 32): `bash scripts/test.sh --fast` deselects these; `bash scripts/test.sh` runs all.
# Marked here by what a test uses, so a new test gets its marker without saying so.
RAY_FIXTURES = frozenset({
    "ray_port",        # tests/deployments: the session's Ray + Serve apps (server, connect, ... use it)
    "served",          # tests/client: the client tests' Serve app
    "serve_instance",  # tests/deployments/test_sp_dit.py: Ray for the two-rank replica
    "cluster",         # tests/deployments/test_multinode.py: a local multi-node cluster
})
BROWSER_FIXTURES = frozenset({"browser"})  # tests/client/test_web.py: Chromium through Playwright
GPU_FOLDER = "gpu"  # tests/gpu/ (none yet): tests that need a CUDA GPU, or a test marks itself @pytest.mark.gpu
# Slow without Ray (minutes on 2 cores): spawned ranks and the 81-frame goldens.
SLOW_MODULES = frozenset({"test_ulysses.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        if item.path.parent.name == GPU_FOLDER:
            item.add_marker(pytest.mark.gpu)
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
