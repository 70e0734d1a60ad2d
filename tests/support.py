"""Paths and helpers shared by the tests (importable as `support`)."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LWF_SHARED", REPO.parent / "shared")).resolve()
GOLDEN_DIR = SHARED / "golden"
TINY_CKPT = SHARED / "ckpt" / "tiny-lingbot-world-base-cam"
EXAMPLES = SHARED / "examples"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.pt"))  # empty without ../shared: parametrizing fails at collection

_golden_cache: dict[str, dict] = {}


def load_golden(name: str) -> dict:
    """Load a golden run once per test session (they are a few MB each)."""
    import torch

    if name not in _golden_cache:
        g = torch.load(GOLDEN_DIR / name, weights_only=True)
        assert g["format"] == "lwf-golden-v1"
        _golden_cache[name] = g
    return _golden_cache[name]


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (the goldens' tolerance measure)."""
    import torch

    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    denom = b.abs().max().item() or 1.0
    return (a - b).abs().max().item() / denom
