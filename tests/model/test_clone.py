"""`DiTEngine.clone` / `VaeEngine.clone` (a fork at a session's head): the copy and its source
continue exactly like one session stepped from the same state, and neither sees the other's
writes (windows, rings, FP8 caches, a deferred update pending, prompt steering)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.dit.caches import DiTCaches, KVCacheConfig
from model.factory import load_dit_engine, load_vae_engine
from support import open_tiny_dit_session


def _inputs(k: int, seed: int):
    """Chunk k's y, poses and intrinsics (seed: which of several paths it takes)."""
    gen = torch.Generator().manual_seed(100 * seed + k)
    poses = np.tile(np.eye(4, dtype=np.float32), (9 if k == 0 else 12, 1, 1))
    poses[:, 0, 3] = 0.03 * np.arange(len(poses)) + k + seed
    return (torch.randn(20, 3, 8, 14, generator=gen), poses,
            np.tile([[50.0, 50, 56, 32]], (len(poses), 1)).astype(np.float32))


def _steps(engine, session, plan: list[int], defer_last: bool = False) -> list[torch.Tensor]:
    """Step `session` through chunks with the inputs of seeds `plan` (chunk k: seed plan[i])."""
    out = []
    for i, seed in enumerate(plan):
        k = session.chunk_index
        y, poses, intrinsics = _inputs(k, seed)
        out.append(engine.step(session, y, poses, intrinsics, defer_update=defer_last and i == len(plan) - 1).latents)
    return out


CASES = {  # name -> (load_dit_engine kwargs, total_latent_frames)
    "planned": ({}, 15),
    "open_ended": ({}, None),
    "window": ({"local_attn_size": 6, "sink_size": 3}, None),
    "ring": ({"local_attn_size": 6, "sink_size": 3, "kv": KVCacheConfig(ring=True)}, None),
    "fp8_scaled": ({"local_attn_size": 6, "sink_size": 3, "kv": KVCacheConfig("fp8_scaled")}, None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("defer", [False, True])
def test_a_clone_and_its_source_continue_like_one_session(case, defer):
    """A: chunks 0..2, cloned into B (a deferred update pending when `defer`); B takes another
    chunk 3 first, then A its chunks 3 and 4: A == the unforked session, B == a session that
    took B's chunk 3 after the same 0..2."""
    kwargs, total = CASES[case]
    engine = load_dit_engine("tiny", None, "float32", "cpu", **kwargs)
    plain = _steps(engine, open_tiny_dit_session(engine, total), [0, 0, 0, 0, 0])
    other = _steps(engine, open_tiny_dit_session(engine, total), [0, 0, 0, 1])

    a = open_tiny_dit_session(engine, total)
    _steps(engine, a, [0, 0, 0], defer_last=defer)
    b = engine.clone(a)
    assert a.pending_update is None and b.pending_update is None and b.chunk_index == a.chunk_index == 3
    b3 = _steps(engine, b, [1])
    a34 = _steps(engine, a, [0, 0])
    assert torch.equal(b3[0], other[3])
    assert all(torch.equal(x, y) for x, y in zip(a34, plain[3:]))


def test_a_clone_keeps_a_steered_prompt_and_closing_one_leaves_the_other():
    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=6, sink_size=3)
    context = torch.randn(5, engine.cfg.text_dim, generator=torch.Generator().manual_seed(9))

    def steered():
        s = open_tiny_dit_session(engine, None)
        _steps(engine, s, [0])
        engine.update_prompt(s, context)
        return _steps(engine, s, [0, 0, 0])[1:]

    source = open_tiny_dit_session(engine, None)
    _steps(engine, source, [0])
    engine.update_prompt(source, context)
    _steps(engine, source, [0])
    copy = engine.clone(source)
    engine.close(source)  # resets the source's caches: the copy's are its own
    assert all(torch.equal(x, y) for x, y in zip(_steps(engine, copy, [0, 0]), steered()))


def test_cache_clones_share_no_tensor():
    """Every tensor of every layer (K, V, FP8 scales, a code cache's descales) is a copy."""
    cfg = load_dit_engine("tiny", None, "float32", "cpu").cfg
    for kv in (KVCacheConfig(), KVCacheConfig("fp8_scaled"), KVCacheConfig("fp8_codes")):
        caches = DiTCaches.allocate(cfg, 6, 3, torch.bfloat16, "cpu", kv=kv)
        k = torch.randn(6, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16)
        for c in caches.self_attn:
            c.update(k, k, 0)
        copy = caches.clone()
        for a, b in zip(caches.self_attn + caches.cross_attn, copy.self_attn + copy.cross_attn):
            tensors = [n for n, v in vars(a).items() if isinstance(v, torch.Tensor)]
            assert tensors and all(getattr(a, n).data_ptr() != getattr(b, n).data_ptr() for n in tensors)
            assert all(torch.equal(getattr(a, n).float(), getattr(b, n).float()) for n in tensors)
        assert (copy.global_end, copy.local_end) == (caches.global_end, caches.local_end)
        caches.self_attn[0].update(2 * k, 2 * k, 6)
        assert copy.global_end == 6


def test_a_vae_clone_decodes_like_its_source():
    """Conditions and decodes after the clone equal the source's, and the source's are unchanged."""
    engine = load_vae_engine("tiny", None, "float32", "cpu")
    image = np.random.default_rng(0).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    latents = [torch.randn(16, 3, 4, 6, generator=torch.Generator().manual_seed(k)) for k in range(3)]

    def run(fork_after: int | None):
        s = engine.open(image, 32, 48)
        out = []
        for k, lat in enumerate(latents):
            if k == fork_after:
                copy = engine.clone(s)
                engine.decode(s, latents[0])  # the source moves on: the copy must not see it
                engine.condition(s)
                s = copy
            out.append((engine.condition(s), engine.decode(s, lat)))
        return out

    plain, forked = run(None), run(1)
    assert all(torch.equal(y0, y1) and np.array_equal(f0, f1) for (y0, f0), (y1, f1) in zip(plain, forked))


def test_the_clone_benchmark_compares_the_copy_and_the_replay_with_the_source(tmp_path):
    """benchmarks/probes/clone_bench.py (run on the GPU for issue 33's latents comparison), on the tiny
    model in float32: the copy and the journal's rebuild continue exactly like the source, and
    the report says so in the figures it states."""
    import json

    from benchmarks.probes.clone_bench import main

    out = tmp_path / "clone.json"
    assert main(["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--size", "64x112",
                 "--chunks", "3", "--repeats", "1", "--vae-chunks", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["chunks"] == 3 and r["fp8"] is False and len(r["dit_clone_s"]) == 1
    assert r["clone_next_equal"] and r["clone_next_rel_err"] == 0.0 and r["clone_next_max_abs_diff"] == 0.0
    assert r["restore_next_equal"] and r["restore_next_rel_err"] == 0.0
    assert r["dit_session_bytes"] > 0 and r["vae_session_bytes"] > 0
