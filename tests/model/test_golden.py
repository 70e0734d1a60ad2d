"""The golden check CLI on every recorded reference run (float32, CPU)."""
from __future__ import annotations

import pytest
import torch

from model import golden as golden_cli
from support import EXAMPLES, GOLDEN_FILES, TINY_CKPT, load_golden


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.stem for p in GOLDEN_FILES])
def test_golden_cli_passes(path, capsys, shared_dir):
    rc = golden_cli.main([str(path), "--ckpt", str(TINY_CKPT), "--examples", str(EXAMPLES)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    assert lines[-1].startswith(f"golden: PASS {path.stem} max_rel=")
    assert float(lines[-1].split("max_rel=")[1]) <= 1e-4
    # every stage of the golden format is compared: one row per DiT call and per chunk input
    g = load_golden(path.name)
    calls = sum(len(c["steps"]) + 1 for c in g["chunks"])
    assert sum(" out " in line for line in lines) == calls
    assert sum("plucker" in line for line in lines) == len(g["chunks"])


def test_golden_check_detects_a_deviation(shared_dir):
    g = dict(load_golden("tiny_00.pt"))
    g["latents"] = g["latents"] * (1 + 1e-3)  # a deviation a wrong sigma would cause
    results = golden_cli.run_golden(g, TINY_CKPT, EXAMPLES)
    bad = [r.stage for r in results if not r.ok]
    assert bad == ["latents"]


def test_golden_cli_rejects_unknown_format(tmp_path, capsys):
    path = tmp_path / "x.pt"
    torch.save({"format": "other"}, path)
    rc = golden_cli.main([str(path), "--ckpt", str(TINY_CKPT), "--examples", str(EXAMPLES)])
    assert rc == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("golden: FAIL")
