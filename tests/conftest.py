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
