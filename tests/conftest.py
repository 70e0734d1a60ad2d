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
BROWSER_FIXTURES = frozenset({"browser"})  # tests/web_support.py: Chromium through Playwright (tests/client/test_web*.py)
BROWSER_TESTS = frozenset({"media/test_fmp4.py::test_plays_in_a_browser_through_media_source_extensions"})
GPU_FOLDER = "gpu"  # tests/gpu/ (none yet): tests that need a CUDA GPU, or a test marks itself @pytest.mark.gpu
# Slow without Ray (5-60 s each on 2 cores, 85 % of the rest's time; `--durations=40`): whole tiny-model
# sessions against the goldens and the offline pipeline, spawned ranks, inductor compilations.
SLOW_MODULES = frozenset({
    "model/test_ulysses.py", "model/test_golden.py", "model/test_pipeline.py", "model/test_compiled.py",
    "model/test_deferred_update.py", "model/test_prompt_steering.py", "client/test_offline_match.py",
    "deployments/test_warm_start.py",  # replicas compiling in processes of their own (~1-2 min each here)
})
SLOW_TESTS = frozenset({
    "model/test_accel.py::test_vae_written_once_transforms_keep_the_streams",
    "model/test_vae.py::test_decode_matches_golden", "model/test_vae.py::test_encode_matches_golden",
    "model/test_vae.py::test_chunked_encode_equals_whole_video_encode",
    "model/test_vae.py::test_chunked_decode_equals_whole_video_decode",
    "model/test_triton_quant.py::test_triton_quantization_kernels",
    "model/test_precision.py::test_bf16_paths_stay_within_2e_2_of_float32",
    "test_benchmark_reports.py::test_the_model_benchmark_runs_through_on_the_tiny_model",
    # a SeaweedFS server of their own started, stopped and started again (~30 s each)
    "deployments/worlds/test_store_contract.py::test_a_stopped_s3_server_is_store_unavailable",
    "deployments/worlds/test_writer.py::test_an_s3_server_stopped_and_started_mid_stream_loses_nothing",
})
TESTS = Path(__file__).resolve().parent


def _folder(item: pytest.Item) -> str:
    """The top-level test folder an item is in ("" for tests/ itself and paths outside it)."""
    if not item.path.is_relative_to(TESTS):
        return ""
    parts = item.path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each folder's tests run together, the folders in the order the command line first names
    # them and the tests within each in theirs: tests/deployments and tests/client each start Ray
    # once (their session fixtures) and stop it when the run leaves the folder, so a run that came
    # back (deployments, client, deployments) found the first Ray's cached fixtures stale: every
    # later Ray test of the folder errored (`pytest tests/deployments/a.py tests/client/b.py
    # tests/deployments/c.py`). A stable sort: one folder's run is unchanged.
    first: dict[str, int] = {}
    for item in items:
        first.setdefault(_folder(item), len(first))
    items.sort(key=lambda item: first[_folder(item)])
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        module = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else item.path.name
        test = f"{module}::{getattr(item, 'originalname', None) or item.name}"
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        if used & BROWSER_FIXTURES or test in BROWSER_TESTS:
            item.add_marker(pytest.mark.browser)
        if item.path.parent.name == GPU_FOLDER:
            item.add_marker(pytest.mark.gpu)
        if module in SLOW_MODULES or test in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
