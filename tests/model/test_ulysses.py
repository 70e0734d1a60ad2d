"""model/parallel: Ulysses sequence parallelism against the single-process model (CPU, gloo).

Each multi-rank test spawns a real gloo process group. Every rank replays the same DiT calls
through the single-process CausalDiT (its own copy) and through its SP rank, and saves what
it measured; the test process asserts on the saved numbers. "Exact" is max rel err <= 1e-6
(float32); whether the outputs are also bit-identical is reported, not required.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from model.accel import AccelOptions, optimize_dit
from model.checkpoint import CheckpointLayout
from model.config import DiTConfig
from model.dit.model import CausalDiT
from model.dit.loader import init_dit_random, load_dit
from model.engines import DiTEngine
from model.dit.caches import DiTCaches
from model.parallel import (
    SequenceShard, SPDiTEngine, UlyssesFastSelfAttention, UlyssesSelfAttention, allocate_sp_caches,
    apply_ulysses, init_sp_group, shard_config, sp_cache_bytes,
)
from model.session import DiTSessionSpec
from support import EXAMPLES, TINY_CKPT, load_golden, rel_err

EXACT = 1e-6  # float32 SP vs single process
GOLDEN_TOL = 1e-5  # as tests/model/test_dit.py
BF16_TOL = 1e-2  # bfloat16 SP vs single process (a few bf16 ulps)
TIMESTEPS = (999, 978, 947, 825)
# A tiny-like config with 4 heads (the tiny preset has 2) for 4 ranks, random weights.
FOUR_HEADS = DiTConfig(dim=128, ffn_dim=256, num_heads=4, num_layers=2, text_dim=64)
ODD_LATENT = (6, 10)  # (3, 5) patches per frame: 45 tokens per chunk, not a multiple of 2 or 4
RANK_TIMEOUT_S = 120.0


# ------------------------------------------------------------------------------- no processes


@pytest.mark.parametrize("tokens, world", [(84, 2), (45, 2), (45, 4), (5, 4), (1, 8)])
def test_sequence_shards_tile_the_padded_sequence(tokens, world):
    x = torch.arange(1, tokens + 1, dtype=torch.float32).view(1, tokens, 1).expand(1, tokens, 3)
    shards = [SequenceShard(tokens, world, r) for r in range(world)]
    parts = [s.take(x) for s in shards]
    assert all(p.shape == (1, shards[0].size, 3) for p in parts)
    joined = torch.cat(parts, dim=1)  # [1, padded, 3]
    assert joined.shape[1] == shards[0].padded >= tokens > shards[0].padded - world
    assert torch.equal(joined[:, :tokens], x)
    assert not joined[:, tokens:].any()  # padding is zero
    assert torch.equal(shards[0].pad(x[0])[:tokens], x[0]) and shards[0].pad(x[0]).shape[0] == shards[0].padded


def test_shard_config_keeps_head_dim_and_rejects_uneven_heads():
    cfg = DiTConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40)
    for world in (1, 2, 4, 5, 8):
        local = shard_config(cfg, world)
        assert (local.num_heads, local.head_dim) == (40 // world, 128)
    with pytest.raises(ValueError, match="40 heads do not split over 3"):
        shard_config(cfg, 3)


@pytest.mark.parametrize("window", [(-1, 0), (6, 3)])
def test_sp_cache_bytes_are_what_a_rank_allocates(window):
    cfg = FOUR_HEADS.with_window(*window)
    frame_seqlen, frames = 15, 6
    full = DiTCaches.allocate(cfg, frame_seqlen, frames, torch.float32, "cpu")
    for world in (1, 2, 4):
        caches = allocate_sp_caches(cfg, world, frame_seqlen, frames, torch.float32, "cpu")
        assert caches.self_attn[0].k.shape == (full.self_attn[0].capacity, 4 // world, cfg.head_dim)
        assert caches.cross_attn[0].k.shape == full.cross_attn[0].k.shape  # text K/V is whole
        assert caches.self_attn[0].rolling == full.self_attn[0].rolling
        assert caches.self_attn[0].sink_tokens == full.self_attn[0].sink_tokens
        kv_frames = cfg.local_attn_size if cfg.local_attn_size != -1 else frames
        assert sp_cache_bytes(cfg, world, frame_seqlen, kv_frames, torch.float32) == caches.nbytes
    assert sp_cache_bytes(cfg, 1, frame_seqlen, frames, torch.float32) == full.nbytes


# ------------------------------------------------------------------------------- rank workers


def _call_stream(chunks: list[dict]):
    """(chunk, call) pairs in order: the 4 denoising calls and the cache update per chunk."""
    for ch in chunks:
        for call in ch["steps"] + [ch["cache_update"]]:
            yield ch, call


def _random_chunks(cfg: DiTConfig, num_chunks: int, latent: tuple[int, int], seed: int) -> list[dict]:
    """Golden-shaped DiT calls with random inputs (x of every call is random)."""
    gen = torch.Generator().manual_seed(seed)
    lh, lw = latent
    fs = (lh // 2) * (lw // 2)
    chunks = []
    for c in range(num_chunks):
        steps = [{"x": torch.randn(16, 3, lh, lw, generator=gen), "t": torch.tensor([t]),
                  "current_start": 3 * fs * c} for t in TIMESTEPS]
        update = {"x": torch.randn(16, 3, lh, lw, generator=gen), "t": torch.tensor([0.0]),
                  "current_start": 3 * fs * c}
        chunks.append({"plucker": torch.randn(1, 384, 3, lh, lw, generator=gen),
                       "y": torch.randn(20, 3, lh, lw, generator=gen), "steps": steps, "cache_update": update})
    return chunks


def _compare_replay(dit: CausalDiT, sp, cfg: DiTConfig, context: torch.Tensor, chunks: list[dict],
                    frame_seqlen: int, lat_f: int, golden: bool) -> dict:
    """Run every call through both models with caches carried; the measured differences."""
    rank, world = sp.rank, sp.world
    ref_caches = DiTCaches.allocate(cfg, frame_seqlen, lat_f, dit.dtype, "cpu")
    sp_caches = allocate_sp_caches(cfg, world, frame_seqlen, lat_f, dit.dtype, "cpu")
    text = dit.embed_text(context)
    heads = slice(rank * cfg.num_heads // world, (rank + 1) * cfg.num_heads // world)
    outs, out_err, golden_err, kv_err, ends_equal, bitwise, write_kv_equal = [], [], [], [], [], [], []
    cam = None
    for ch, call in _call_stream(chunks):
        if call is ch["steps"][0]:
            cam, cam_sp = dit.camera_features(ch["plucker"]), sp.camera_features(ch["plucker"])
        args = (call["x"], call["t"], ch["y"], text)
        written = None
        if call is ch["cache_update"]:  # the engine's form of this call: only the cache writes
            written = copy.deepcopy(sp_caches)
            sp.write_kv(*args, cam_sp, written, call["current_start"])
        ref = dit(*args, cam, ref_caches, call["current_start"])
        out = sp(*args, cam_sp, sp_caches, call["current_start"])
        if written is not None:
            write_kv_equal.append(all(
                (w.global_end, w.local_end) == (s.global_end, s.local_end)
                and torch.equal(w.k, s.k) and torch.equal(w.v, s.v)
                for w, s in zip(written.self_attn, sp_caches.self_attn)))
        outs.append(out)
        out_err.append(rel_err(out, ref))
        bitwise.append(torch.equal(out, ref))
        if golden:
            golden_err.append(rel_err(out, call["out"]))
        for r, s in zip(ref_caches.self_attn, sp_caches.self_attn):
            ends_equal.append((r.global_end, r.local_end) == (s.global_end, s.local_end))
            n = r.local_end
            kv_err.append(max(rel_err(s.k[:n], r.k[:n, heads]), rel_err(s.v[:n], r.v[:n, heads])))
    return {"outs": outs, "out_err": out_err, "golden_err": golden_err, "kv_err": kv_err, "ends_equal": ends_equal,
            "bitwise": bitwise, "write_kv_equal": write_kv_equal, "calls": len(out_err),
            "local_end": ref_caches.local_end, "global_end": ref_caches.global_end}


def _engine_run(dit: CausalDiT, sp, latent: tuple[int, int], chunks: int) -> dict:
    """DiTEngine vs SPDiTEngine over whole chunks (sampler, noise plan, camera track, caches)."""
    d = EXAMPLES / "00"
    poses, intrinsics = np.load(d / "poses.npy"), np.load(d / "intrinsics.npy")
    gen = torch.Generator().manual_seed(7)
    spec = DiTSessionSpec(context=torch.randn(9, dit.cfg.text_dim, generator=gen),
                          height=8 * latent[0], width=8 * latent[1], seed=11, total_latent_frames=3 * chunks)
    single, parallel = DiTEngine(dit), SPDiTEngine(sp)
    s_ref, s_sp = single.open(spec), parallel.open(spec)
    errs, latents = [], []
    for c in range(chunks):
        y = torch.randn(20, 3, *latent, generator=gen)
        cams = (poses[12 * c : 12 * c + 12], intrinsics[12 * c : 12 * c + 12])
        ref = single.step(s_ref, y, *cams).latents
        out = parallel.step(s_sp, y, *cams).latents
        errs.append(rel_err(out, ref))
        latents.append(out)
    return {"engine_err": errs, "latents": torch.stack(latents)}


def _models(name: str, group) -> tuple[CausalDiT, object]:
    """(single-process model, SP rank) of `name`: "tiny" (the checkpoint) or "heads4" (random),
    with "_bf16" bfloat16 weights and caches, "_fast" the fast block of model/accel on both,
    "_fp8" the fast block with FP8 GEMMs."""
    base, variant = (name.split("_") + [""])[:2]
    dtype = torch.bfloat16 if variant in ("bf16", "fp8") else torch.float32
    if base == "tiny":
        dit = load_dit(CheckpointLayout.discover(TINY_CKPT), dtype, "cpu")
    else:
        dit = init_dit_random(FOUR_HEADS, dtype, "cpu", seed=3)
    twin = copy.deepcopy(dit)
    fast = variant in ("fast", "fp8")
    if fast:
        optimize_dit(dit, AccelOptions(fast=True, fp8=variant == "fp8"))
        optimize_dit(twin, AccelOptions(fast=True, fp8=variant == "fp8"))
    sp = apply_ulysses(twin, group)
    kind = UlyssesFastSelfAttention if fast else UlyssesSelfAttention
    assert all(type(b.self_attn) is kind for b in twin.blocks)
    return dit, sp


def _rank_main(rank: int, world: int, rdzv: str, out_dir: str, cases: tuple[str, ...]) -> None:
    """Each case is "model/inputs": model as `_models`; inputs "golden:FILE" (the golden's
    calls), "odd" / "odd_window" (random calls, 45 tokens per chunk; a rolling window), or
    "engine" (whole chunks through DiTEngine and SPDiTEngine)."""
    torch.set_num_threads(1)
    group = init_sp_group(rank, world, rdzv, torch.device("cpu"), timeout_s=RANK_TIMEOUT_S)
    results, models = {}, {}
    with torch.inference_mode():
        for case in cases:
            model, inputs = case.split("/")
            if inputs == "uneven":  # more ranks than the model has heads
                try:
                    _models(model, group)
                except ValueError as e:
                    results[case] = str(e)
                continue
            if model not in models:
                models[model] = _models(model, group)
            dit, sp = models[model]
            if inputs.startswith("golden:"):
                g = load_golden(inputs.removeprefix("golden:"))
                m = g["meta"]
                cfg = dit.cfg.with_window(m["local_attn_size"], m["sink_size"])
                results[case] = _compare_replay(dit, sp, cfg, g["t5"]["context"], g["chunks"],
                                                m["frame_seqlen"], m["lat_f"], golden=True)
            elif inputs in ("odd", "odd_window"):
                cfg = dit.cfg.with_window(6, 3) if inputs == "odd_window" else dit.cfg
                chunks = _random_chunks(cfg, 3, ODD_LATENT, seed=5)
                context = torch.randn(7, cfg.text_dim, generator=torch.Generator().manual_seed(6))
                fs = (ODD_LATENT[0] // 2) * (ODD_LATENT[1] // 2)
                results[case] = _compare_replay(dit, sp, cfg, context, chunks, fs, 9, golden=False)
            else:
                assert inputs == "engine", case
                results[case] = _engine_run(dit, sp, ODD_LATENT, chunks=2)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def run_ranks(world: int, cases: tuple[str, ...], tmp_path: Path) -> list[dict]:
    """Spawn `world` gloo ranks running `cases`; their saved results, by rank."""
    mp.spawn(_rank_main, args=(world, f"file://{tmp_path / 'rdzv'}", str(tmp_path), cases), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def check_replay(name: str, results: list[dict], calls: int, tol: float = EXACT) -> None:
    for rank, res in enumerate(results):
        r = res[name]
        assert r["calls"] == calls, (name, rank)
        assert all(r["ends_equal"]), f"{name} rank {rank}: cache indices differ"
        assert r["write_kv_equal"] and all(r["write_kv_equal"]), f"{name} rank {rank}: write_kv's caches differ"
        assert max(r["out_err"]) <= tol, f"{name} rank {rank}: outputs {max(r['out_err']):.3g}"
        assert max(r["kv_err"]) <= tol, f"{name} rank {rank}: KV cache {max(r['kv_err']):.3g}"
        if r["golden_err"]:
            assert max(r["golden_err"]) < GOLDEN_TOL, f"{name} rank {rank}: vs golden"
        print(f"{name} rank {rank}/{len(results)}: {r['calls']} calls, max rel err out "
              f"{max(r['out_err']):.2g}, kv {max(r['kv_err']):.2g}; bit-identical outputs "
              f"{sum(r['bitwise'])}/{r['calls']}")
    # Every rank returns the whole output: all ranks agree bit for bit with each other.
    for res in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0][name]["outs"], res[name]["outs"]))


# ------------------------------------------------------------------------------- 2 and 4 ranks


def test_two_ranks_match_the_single_process_model(tmp_path):
    """The tiny checkpoint: both goldens' calls (full cache; rolling window with sink), a token
    count that needs padding, whole engine chunks, bf16, and the fast block (model/accel) with
    and without FP8 GEMMs."""
    golden00, golden03 = "tiny/golden:tiny_00.pt", "tiny/golden:tiny_03_local6_sink3.pt"
    cases = (golden00, golden03, "tiny/odd", "tiny/engine", "tiny_fast/golden:tiny_00.pt", "tiny_fast/odd",
             "tiny_bf16/odd", "tiny_fp8/odd")
    results = run_ranks(2, cases, tmp_path)
    check_replay(golden00, results, calls=10)
    check_replay(golden03, results, calls=20)
    assert results[0][golden03]["global_end"] == 336  # rolled twice
    check_replay("tiny/odd", results, calls=15)
    check_replay("tiny_fast/golden:tiny_00.pt", results, calls=10)
    check_replay("tiny_fast/odd", results, calls=15)
    check_replay("tiny_bf16/odd", results, calls=15, tol=BF16_TOL)
    check_replay("tiny_fp8/odd", results, calls=15, tol=BF16_TOL)
    engine = [res["tiny/engine"] for res in results]
    assert max(max(e["engine_err"]) for e in engine) <= EXACT, [e["engine_err"] for e in engine]
    assert torch.equal(engine[0]["latents"], engine[1]["latents"])  # ranks hold the same latents


def test_four_ranks_match_the_single_process_model(tmp_path):
    """A 4-head config; 45 tokens per chunk (3 padding tokens on the last rank), caches carried
    over 3 chunks, with and without a rolling window; the fast block."""
    cases = ("heads4/odd", "heads4/odd_window", "heads4_fast/odd_window", "tiny/uneven")
    results = run_ranks(4, cases, tmp_path)
    assert all("2 heads do not split over 4 ranks" in res["tiny/uneven"] for res in results)
    for case in ("heads4/odd", "heads4/odd_window", "heads4_fast/odd_window"):
        check_replay(case, results, calls=15)
    assert results[0]["heads4/odd_window"]["local_end"] == 6 * 15  # the window is full and rolled
    assert results[0]["heads4/odd_window"]["global_end"] == 9 * 15
