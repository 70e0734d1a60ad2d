"""A session rebuilt from its journal continues as the computed one with an FP8 code cache too
(issue 44, item 3). The code cache's one descale per tensor grows with every write, the denoising
calls' noisy rows included, and rescales the codes cached before them; a rebuild replays only
each chunk's clean write. Measured on an H100 (benchmarks/probes/replay_check.py): the rebuilt
session's V codes and descales differed and its next chunks by up to 0.065. The computed chunk
now journals its growth record (`ChunkOutput.kv_growth`) and the rebuild redoes it before the
clean write (`DiTCaches.regrow`). Checked here on the CPU, bitwise, through the FP8 attention's
stand-in (tests/support.py), with and without the fast block's bound K scales, full attention and
a rolling window."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from model.accel import AccelOptions, optimize_dit
from model.config import DiTConfig
from model.dit.caches import KVCacheConfig
from model.dit.kv_codes import Fp8CodesKVCache
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.session import DiTSessionSpec, PastChunk

CHUNKS, NEXT = 4, 2


@pytest.fixture
def fp8_dit(fake_cudnn, monkeypatch):
    from model.accel import transforms

    monkeypatch.setattr(transforms, "fp8_attention_available", lambda device: True)

    def make(window: bool) -> torch.nn.Module:
        cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2)
        cfg = cfg.with_window(6, 3) if window else cfg
        return init_dit_random(cfg, torch.float32, "cpu", 3, residual_scaled=True)
    return make


def _inputs(k: int, gen: torch.Generator):
    y = torch.randn(20, 3, 4, 6, generator=gen)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 0, 3] = 0.05 * (k * 12 + np.arange(12))
    intrinsics = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
    return y, poses, intrinsics


def _computed_and_rebuilt(engine: DiTEngine, regrow: bool):
    gen = torch.Generator().manual_seed(11)
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=gen), height=32, width=48, seed=5)
    feed = [_inputs(k, gen) for k in range(CHUNKS + NEXT)]
    live, journal = engine.open(spec), []
    for k in range(CHUNKS):
        y, poses, intrinsics = feed[k]
        out = engine.step(live, y.clone(), poses, intrinsics, defer_update=True)  # as a replica steps
        engine.finish_chunk(live)
        journal.append(PastChunk(poses, intrinsics, y, out.latents, None, out.kv_growth if regrow else None))
    noise = live.noise.state()
    rebuilt = engine.open(spec)
    for chunk in journal:
        engine.replay(rebuilt, spec, [chunk], None)
    engine.replay(rebuilt, spec, [], noise)
    caches = [(a, b) for a, b in zip(live.caches.self_attn, rebuilt.caches.self_attn)]
    nexts = []
    for k in range(CHUNKS, CHUNKS + NEXT):
        y, poses, intrinsics = feed[k]
        nexts.append([engine.step(s, y.clone(), poses, intrinsics).latents for s in (live, rebuilt)])
    return journal, caches, nexts


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype.itemsize == 1 else torch.equal(a, b)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("bound", [False, True])
def test_a_rebuilt_fp8_code_cache_is_the_computed_one_bit_for_bit(fp8_dit, window, bound):
    dit = fp8_dit(window)
    engine = DiTEngine(optimize_dit(dit, AccelOptions(fast=True, attention="cudnn_fp8", qk_bound_scales=bound)),
                       kv=KVCacheConfig("fp8_codes"))
    journal, caches, nexts = _computed_and_rebuilt(engine, regrow=True)
    growth = journal[0].kv_growth
    assert growth is not None and growth.shape[:2] == (dit.cfg.num_layers, 4)  # 4 denoising calls a chunk
    assert isinstance(caches[0][0], Fp8CodesKVCache)
    for a, b in caches:
        assert _same(a.k, b.k) and _same(a.v, b.v) and torch.equal(a.descale, b.descale)
        assert (a.global_end, a.local_end) == (b.global_end, b.local_end)
    assert all(torch.equal(x, y) for x, y in nexts)


def test_without_the_growth_record_the_rebuild_differs(fp8_dit):
    """The control: what the record fixes is real (the noisy rows grew the descales)."""
    engine = DiTEngine(optimize_dit(fp8_dit(False), AccelOptions(fast=True, attention="cudnn_fp8")),
                       kv=KVCacheConfig("fp8_codes"))
    _, caches, nexts = _computed_and_rebuilt(engine, regrow=False)
    assert any(not torch.equal(a.descale, b.descale) for a, b in caches)
    assert any(not torch.equal(x, y) for x, y in nexts)


def test_other_cache_formats_record_nothing(fp8_dit):
    engine = DiTEngine(optimize_dit(fp8_dit(False), AccelOptions(fast=True)), kv=KVCacheConfig())
    journal, _, nexts = _computed_and_rebuilt(engine, regrow=True)
    assert journal[0].kv_growth is None and all(torch.equal(x, y) for x, y in nexts)


def test_a_chunk_given_up_carries_its_growth_into_the_next_record(fp8_dit):
    """A driven chunk given up for newer keys (`should_stop`, preemption) ran denoising calls
    that grew the descales; the chunk made after it journals that growth first, so the rebuild
    is still the computed session bit for bit."""
    from model.engine_api import ChunkPreempted  # noqa: PLC0415

    engine = DiTEngine(optimize_dit(fp8_dit(True), AccelOptions(fast=True, attention="cudnn_fp8")),
                       kv=KVCacheConfig("fp8_codes"))
    gen = torch.Generator().manual_seed(11)
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=gen), height=32, width=48, seed=5)
    feed = [_inputs(k, gen) for k in range(CHUNKS + 1)]
    live, journal = engine.open(spec), []
    for k in range(CHUNKS):
        y, poses, intrinsics = feed[k]
        if k == 2:  # given up after two of its four denoising calls, then made with other poses
            calls = iter([False, False, True])
            with pytest.raises(ChunkPreempted):
                engine.step(live, y.clone(), poses * 1.5, intrinsics, should_stop=lambda: next(calls))
        out = engine.step(live, y.clone(), poses, intrinsics, defer_update=True)
        engine.finish_chunk(live)
        journal.append(PastChunk(poses, intrinsics, y, out.latents, None, out.kv_growth))
    assert journal[2].kv_growth.shape[1] == 2 + 4  # the given-up chunk's two calls, then its own four
    rebuilt = engine.open(spec)
    for chunk in journal:
        engine.replay(rebuilt, spec, [chunk], None)
    engine.replay(rebuilt, spec, [], live.noise.state())
    for a, b in zip(live.caches.self_attn, rebuilt.caches.self_attn):
        assert _same(a.v, b.v) and torch.equal(a.descale, b.descale)
    y, poses, intrinsics = feed[CHUNKS]
    assert torch.equal(engine.step(live, y.clone(), poses, intrinsics).latents,
                       engine.step(rebuilt, y.clone(), poses, intrinsics).latents)
