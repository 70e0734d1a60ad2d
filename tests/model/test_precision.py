"""bf16 against float32 at the released depth (40 blocks), reduced width, CPU.

The GPU numerics guard (docs/PERFORMANCE.md, "Numerics") compares the bf16 paths with a
float32 run of the same bf16-valued weights; these tests hold the same comparison at a size
the CPU runs in seconds, with the residual-scaled random init.
"""
from __future__ import annotations

import math

import pytest
import torch

from model.accel import AccelOptions, optimize_dit
from model.dit.plucker import plucker_embedding
from model.config import DiTConfig
from model.dit.model import CausalDiT
from model.dit.loader import INIT_STD, RESIDUAL_OUTPUTS, init_dit_random
from model.dit.caches import DiTCaches

LAYERS = 40
CFG = DiTConfig(dim=256, ffn_dim=640, num_heads=2, num_layers=LAYERS, text_len=32)  # head_dim 128
LAT_H, LAT_W = 4, 8


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, LAT_H, LAT_W, generator=gen)
    y = torch.randn(20, 3, LAT_H, LAT_W, generator=gen)
    context = torch.randn(24, CFG.text_dim, generator=gen) * 0.2
    poses = torch.eye(4).repeat(3, 1, 1)
    poses[:, 2, 3] = torch.tensor([0.0, 0.5, 1.0])  # a forward walk
    h, w = 8 * LAT_H, 8 * LAT_W
    plucker = plucker_embedding(poses, [w, w, w / 2, h / 2], h, w)
    return x, torch.tensor([900]), y, context, plucker


def first_call(dit: CausalDiT, x, t, y, context, plucker) -> torch.Tensor:
    """Chunk 0's first DiT call -> float32 velocity."""
    caches = DiTCaches.allocate(CFG, (LAT_H // 2) * (LAT_W // 2), 3, dit.dtype, "cpu")
    with torch.no_grad():
        return dit(x, t, y, dit.embed_text(context), dit.camera_features(plucker), caches, 0)


def test_residual_scaled_init_rescales_only_the_residual_outputs():
    cfg = DiTConfig(dim=256, ffn_dim=640, num_heads=2, num_layers=2, text_len=32)
    plain = dict(init_dit_random(cfg, torch.float32, "cpu", 7).named_parameters())
    scaled = dict(init_dit_random(cfg, torch.float32, "cpu", 7, residual_scaled=True).named_parameters())
    factor = 1 / math.sqrt(2 * cfg.num_layers)
    rescaled = [n for n in plain if n.startswith("blocks.") and n.endswith(RESIDUAL_OUTPUTS)]
    assert len(rescaled) == len(RESIDUAL_OUTPUTS) * cfg.num_layers
    for name, value in plain.items():
        if name in rescaled:
            torch.testing.assert_close(scaled[name], value * factor, rtol=1e-6, atol=0)
            assert abs(scaled[name].std().item() - INIT_STD * factor) < 0.1 * INIT_STD * factor
        else:
            assert torch.equal(scaled[name], value), name


def test_bf16_paths_stay_within_2e_2_of_float32(inputs):
    """Plain and fast bf16 against float32 (same bf16-valued weights), max|a-b| / max|b|; and
    the float32 network itself barely moves when its input is rounded to bf16 (no chaos)."""
    ref_dit = init_dit_random(CFG, torch.bfloat16, "cpu", 5, residual_scaled=True).float()
    ref = first_call(ref_dit, *inputs)
    x, *rest = inputs
    assert max_rel(first_call(ref_dit, x.bfloat16().float(), *rest), ref) < 2e-3
    plain = init_dit_random(CFG, torch.bfloat16, "cpu", 5, residual_scaled=True)
    err_plain = max_rel(first_call(plain, *inputs), ref)
    fast = optimize_dit(plain, AccelOptions(fast=True))
    err_fast = max_rel(first_call(fast, *inputs), ref)
    assert 1e-4 < err_plain < 2e-2  # bf16 rounding is there, and bounded
    assert abs(err_fast - err_plain) < 2e-3
