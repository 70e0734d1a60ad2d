"""The VAE session footprint (model/vae/footprint.py) against what a real session holds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from model.config import preset
from model.factory import load_vae_engine, vae_cache_layout
from model.tiny import EMBEDDED_VAE
from camera.frames import CHUNK_VIDEO_FRAMES
from model.vae.cache import CACHE_T
from model.vae.footprint import BATCHED_EXTRA_FRAMES, CHUNK_STEP_FRAMES, CacheLayout


@pytest.fixture(scope="module")
def engine():
    return load_vae_engine("tiny", None, "float32", "cpu")


@pytest.mark.parametrize("size", [(32, 48), (48, 32), (64, 112)])
def test_the_estimate_covers_what_a_session_holds_after_condition_and_decode(engine, size):
    """Probed at 32x32, the layout predicts the caches at other sizes: never below the bytes a
    real session holds after three chunks, and not far above them (held within 1.5x, held plus
    the working reservation within 4x)."""
    layout = CacheLayout.probe(engine)
    h, w = size
    session = engine.open(np.full((h, w, 3), 90, dtype=np.uint8), h, w)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        engine.condition(session)
        engine.decode(session, torch.randn(16, 3, h // 8, w // 8, generator=generator))
        need = layout.footprint(h, w)
        assert session.nbytes <= need.held <= 1.5 * session.nbytes
    assert need.total <= 4 * session.nbytes
    assert session.enc_cache.nbytes > 0 and session.dec_cache.nbytes > 0


def test_the_footprint_grows_with_the_output_area(engine):
    layout = CacheLayout.probe(engine, (32, 48))
    small, large = layout.footprint(32, 48), layout.footprint(64, 96)
    assert 3.5 * small.held < large.held <= 4 * small.held
    assert large.working == 4 * small.working



def test_batched_calls_reserve_one_more_frame_row_while_a_call_runs(engine):
    """A VAE that runs a chunk's frames in one call (the GPU replicas') holds the same caches
    and reserves BATCHED_EXTRA_FRAMES more full-resolution frame rows of activations per call."""
    per_step = CacheLayout.probe(engine, (32, 48))
    try:
        engine.vae.batch_frames = True
        batched = CacheLayout.probe(engine, (32, 48))
    finally:
        del engine.vae.batch_frames
    assert batched.batched and not per_step.batched
    a, b = per_step.footprint(64, 96), batched.footprint(64, 96)
    assert b.held == a.held
    decoded = CHUNK_VIDEO_FRAMES * 64 * 96 * 3 * 5  # the chunk in float32 and uint8, in both
    row = (a.working - decoded) // (CHUNK_STEP_FRAMES + CACHE_T)  # one frame of every working row
    assert row > 0 and b.working - a.working == BATCHED_EXTRA_FRAMES * row


@pytest.mark.parametrize(("dtype", "batched"), [("float32", False), ("float32", True), ("bfloat16", True)])
def test_the_layout_from_the_architecture_is_the_probed_one(dtype, batched):
    """`vae_cache_layout` runs the probe on fake tensors: every slot (channels, frames, scale,
    itemsize) and the image's itemsize equal what a real probe session holds, for the embedded
    VAE in float32 and the tiny checkpoint's (random weights) in bf16."""
    if dtype == "float32":
        engine, cfg = load_vae_engine("tiny", None, dtype, "cpu"), EMBEDDED_VAE
    else:
        engine, cfg = load_vae_engine("tiny", None, dtype, "cpu", random_weights=True), preset("tiny").vae
    engine.vae.batch_frames = batched
    probed = CacheLayout.probe(engine, (32, 48))
    assert vae_cache_layout(cfg, dtype, batched=batched, host_muxer=True) == probed
    assert probed.slots and {s.itemsize for s in probed.slots} == {torch.empty(0, dtype=getattr(torch, dtype)).element_size()}


def test_the_full_size_layout_is_computed_without_arithmetic():
    """The released VAE's layout in bf16 (what the GPU configs' admission tests size with) comes
    from shapes alone: its 2.71 GiB held per 464x832 session (the module docstring's calibration)."""
    layout = vae_cache_layout(preset("lingbot-world-fast").vae, "bfloat16", batched=True, host_muxer=False)
    assert 2.70 < layout.footprint(464, 832).held / 2**30 < 2.72


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the real full-size probe needs a CUDA GPU (bf16 kernels)")
def test_the_full_size_layout_equals_a_probe_on_the_gpu():
    engine = load_vae_engine("lingbot-world-fast", None, "bfloat16", "cuda", random_weights=True)
    engine.vae.batch_frames = True
    probed = dataclasses.replace(CacheLayout.probe(engine), host_muxer=False)
    assert vae_cache_layout(preset("lingbot-world-fast").vae, "bfloat16", batched=True, host_muxer=False) == probed
