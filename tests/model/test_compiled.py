"""The compiled paths the GPU configs serve, run on the CPU (inductor): the DiT's compiled block
regions and the VAE's compiled RMSNorm + SiLU against the goldens, after a warm-up at the
goldens' size, and without any compilation after the warm-up (what the replicas rely on:
the first session after start must not compile)."""
from __future__ import annotations

import pytest
import torch

from model.accel import AccelOptions, optimize_dit, optimize_vae
from model.checkpoint import VAE_FILE, CheckpointLayout
from model.dit.loader import load_dit
from model.engines import DiTEngine, VaeEngine
from model.vae.model import load_vae
from model.vae.cache import VaeCache
from model.warmup import allow_recompiles, warm_up_dit, warm_up_vae
from support import load_golden, rel_err, replay_golden

GOLDEN_SIZE = (64, 112)  # every golden run's output size
DIT_GOLDENS = ("tiny_00.pt", "tiny_03_local6_sink3.pt")  # full attention, and the rolling window


def compilations() -> int:
    """Graphs dynamo has compiled so far in this process."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def compiled_dit(tiny_ckpt) -> DiTEngine:
    dit = load_dit(CheckpointLayout.discover(tiny_ckpt), torch.float32, "cpu")
    engine = DiTEngine(optimize_dit(dit, AccelOptions(fast=True, compile=True)))
    allow_recompiles(1)
    start = compilations()
    report = warm_up_dit(engine, [GOLDEN_SIZE])
    assert report.sizes == [GOLDEN_SIZE] and report.seconds > 0
    assert compilations() > start  # the warm-up is what compiled
    return engine


@pytest.fixture(scope="module")
def compiled_vae(tiny_ckpt) -> VaeEngine:
    options = AccelOptions(vae_channels_last=True, vae_compile=True)
    engine = VaeEngine(optimize_vae(load_vae(tiny_ckpt / VAE_FILE), options))
    allow_recompiles(1)
    muxed: list[int] = []
    start = compilations()
    warm_up_vae(engine, [GOLDEN_SIZE], consumer=lambda hw: lambda frames: muxed.append(frames.shape[0]))
    assert muxed == [9, 12, 12] and compilations() > start
    return engine


@pytest.mark.parametrize("name", DIT_GOLDENS)
def test_compiled_dit_regions_match_goldens_without_compiling_again(compiled_dit, name):
    dit, g = compiled_dit.dit, load_golden(name)
    assert all(b.kernels.compiled for b in dit.blocks)
    before = compilations()
    errors = []
    with torch.inference_mode():  # as the engine runs it (grad mode is part of the compiled guards)
        for call, out, caches in replay_golden(dit, g):
            errors.append(rel_err(out, call["out"]))
            assert [c.local_end for c in caches.self_attn] == call["kv_local_end_after"]
    assert max(errors) < 1e-4
    assert compilations() == before, "a session at a warmed-up size compiled again"


def test_compiled_vae_matches_goldens_without_compiling_again(compiled_vae):
    g = load_golden("tiny_00.pt")
    vae = compiled_vae.vae
    video = torch.zeros(g["vae_encode"]["input_shape"])  # the image, then zero frames
    video[:, 0] = g["vae_encode"]["input_first_frame"]
    before = compilations()
    with torch.inference_mode():
        enc, latents = VaeCache.empty(), []
        for start, end in [(0, 9), (9, 21)]:  # the conditioning chunks: 1 + 8, then 12 frames
            z, enc = vae.encode_chunk(video[:, start:end], enc)
            latents.append(z)
        dec, frames = VaeCache.empty(), []
        for k in range(2):
            x, dec = vae.decode_chunk(g["latents"][:, 3 * k:3 * k + 3], dec)
            frames.append(x)
    assert rel_err(torch.cat(latents, dim=1), g["vae_encode"]["latent"]) <= 1e-5
    assert rel_err(torch.cat(frames, dim=1), g["video"]) <= 1e-5
    assert compilations() == before, "a session at a warmed-up size compiled again"
