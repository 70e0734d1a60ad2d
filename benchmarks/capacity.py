"""How many sessions one DiT replica holds, measured on the device (issues 13 and 18).

    python -m benchmarks.capacity --out $OUT/capacity.json          # one H200, ~6 minutes

The DiT engine a replica serves with (released sizes, seeded random weights, bf16, the fast
block with cuDNN attention and compiled regions, the GPU configs' window sink 3 + 15) is
loaded and warmed up once. Then, for each scenario (a card and the DiT's share of it, full
attention over 81 frames or the rolling window, the exact or the FP8 KV cache):

1. the process is capped at the share as a replica caps itself (`set_per_process_memory_fraction`;
   an 80 GB card is emulated on a larger one by the fraction of its bytes, `--card-gib`), and
   the session budget is computed as the replica computes it (`deployments.replicas.memory`);
2. admission's count: the most sessions whose held bytes plus the largest working set fit the
   budget (`SessionTable`'s rule, `DiTEngine.footprint`);
3. that many sessions are opened and run: session 0 to its last chunk (7 for 81 frames; the
   window sessions past the window's first roll), the others one chunk each; the peak memory
   is recorded and an out-of-memory error is a failed scenario;
4. one session more than admission allows is opened and run for a chunk (admission would
   refuse it): whether it fits shows the headroom admission leaves.

Session 0's latents of the exact and the FP8 KV cache scenarios at the same share (same
seeds, same camera) give the FP8 cache's deviation per chunk; its chunk times give its cost.
The JSON is rewritten after every scenario.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from benchmarks.window import dolly_chunk
from benchmarks.vae_check import norm_rel_err
from camera import CHUNK_LATENT_FRAMES, chunk_video_frames, planned_latent_frames
from deployments.replicas.memory import resident_model_bytes, session_budget
from model.accel import AccelOptions
from model.dit.caches import KVCacheConfig
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.session import DiTSessionSpec
from model.warmup import warm_up_dit

GIB = 1024**3
SEED = 4321
TEXT_TOKENS = 64
FULL_FRAMES = 81  # video frames of a full-attention session: 21 latent frames, 7 chunks


@dataclass(frozen=True)
class Scenario:
    name: str
    card_gib: Optional[float]  # None: this device
    share: float  # the DiT's fraction of the card (its num_gpus)
    full_attention: bool
    kv_fp8: bool
    long_chunks: int  # chunks of session 0


def scenarios(card_gib: float, window_chunks: int) -> list[Scenario]:
    out = []  # this card first (a run cut short keeps it), each exact cache before its FP8 twin
    for card, share, label in ((None, 0.75, "this card x0.75"), (card_gib, 0.75, "80GB x0.75"),
                               (card_gib, 1.0, "80GB x1.0")):
        for full in (True, False):
            for kv_fp8 in (False, True):
                chunks = 7 if full else window_chunks if card is None else 6
                out.append(Scenario(f"{label} {'full' if full else 'window'} {'fp8kv' if kv_fp8 else 'bf16kv'}",
                                    card, share, full, kv_fp8, chunks))
    return out


def admitted_sessions(budget: int, held: int, working: int) -> int:
    """SessionTable's rule for equal sessions: n held plus one working set within the budget."""
    return max(0, (budget - working) // held) if held > 0 and budget >= held + working else 0


def _spec(engine: DiTEngine, height: int, width: int, full: bool, index: int) -> DiTSessionSpec:
    gen = torch.Generator().manual_seed(SEED + index)
    latent_frames = planned_latent_frames(FULL_FRAMES) if full else None
    return DiTSessionSpec(context=torch.randn(TEXT_TOKENS, engine.cfg.text_dim, generator=gen), height=height,
                          width=width, seed=SEED + index, total_latent_frames=latent_frames, full_attention=full)


def _step(engine: DiTEngine, session, height: int, width: int) -> tuple[float, torch.Tensor]:
    k = session.chunk_index
    poses, intrinsics = dolly_chunk(k)
    n = chunk_video_frames(k)
    poses, intrinsics = poses[:n], intrinsics[:n]
    y = torch.randn(20, CHUNK_LATENT_FRAMES, height // 8, width // 8, generator=torch.Generator().manual_seed(k))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = engine.step(session, y, poses, intrinsics)
    return time.perf_counter() - t0, out.latents


def run_scenario(engine: DiTEngine, sc: Scenario, resident: int, height: int, width: int) -> dict:
    total = torch.cuda.get_device_properties(0).total_memory
    card = total if sc.card_gib is None else int(sc.card_gib * GIB)
    cap = int(sc.share * card)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    torch.cuda.reset_peak_memory_stats()
    engine.kv = KVCacheConfig.for_serving("cuda", "fp8" if sc.kv_fp8 else "dtype")
    budget = session_budget(None, cap, resident)
    latent = planned_latent_frames(FULL_FRAMES) if sc.full_attention else None
    kv_frames = engine.kv_frames(latent, sc.full_attention)
    need = engine.footprint(height, width, kv_frames, latent)
    admitted = admitted_sessions(budget, need.held, need.working)
    res: dict = {**asdict(sc), "cap_gib": cap / GIB, "budget_gib": budget / GIB, "held_gib": need.held / GIB,
                 "working_gib": need.working / GIB, "admitted": int(admitted), "ran": 0, "oom": None,
                 "chunk_s": [], "latents": []}
    sessions = []
    try:
        for i in range(int(admitted)):
            sessions.append(engine.open(_spec(engine, height, width, sc.full_attention, i)))
        for s in sessions[1:]:
            _step(engine, s, height, width)
        for _ in range(sc.long_chunks if sessions else 0):
            seconds, latents = _step(engine, sessions[0], height, width)
            res["chunk_s"].append(seconds)
            res["latents"].append(latents)
        res["ran"] = len(sessions)
    except torch.cuda.OutOfMemoryError as e:
        res["oom"] = str(e).split("\n")[0][:300]
    res["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    res["allocated_gib"] = torch.cuda.memory_allocated() / GIB
    extra = None
    if res["oom"] is None:  # one more than admission allows: does it fit anyway?
        try:
            extra = engine.open(_spec(engine, height, width, sc.full_attention, len(sessions)))
            _step(engine, extra, height, width)
            res["one_more_fits"] = True
        except torch.cuda.OutOfMemoryError:
            res["one_more_fits"] = False
        res["peak_with_one_more_gib"] = torch.cuda.max_memory_allocated() / GIB
    for s in sessions + ([extra] if extra is not None else []):
        engine.close(s)
    del sessions, extra
    torch.cuda.empty_cache()
    return res


def deviation(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    return [norm_rel_err(x, y) for x, y in zip(a, b)]


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="464*832")
    p.add_argument("--card-gib", type=float, default=79.2, help="the emulated 80 GB card (what torch reports "
                                                                "for an H100/A100 80GB)")
    p.add_argument("--window-chunks", type=int, default=10, help="chunks of session 0 in the window scenarios "
                                                                 "on this card (the window rolls from chunk 5)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--only", nargs="*", default=None, help="scenario names to run (default: all)")
    p.add_argument("--out", type=Path, default=Path("capacity.json"))
    args = p.parse_args(argv)
    height, width = (int(s) for s in args.size.split("*"))
    t0 = time.perf_counter()
    engine = load_dit_engine("lingbot-world-fast", None, torch.bfloat16, "cuda", local_attn_size=15, sink_size=3,
                             options=AccelOptions.for_serving("cuda", compile=not args.no_compile),
                             random_weights=True)
    result: dict = {"gpu": torch.cuda.get_device_name(), "total_gib": torch.cuda.get_device_properties(0).total_memory
                    / GIB, "size": [height, width], "compile": not args.no_compile, "load_s": time.perf_counter() - t0,
                    "scenarios": []}
    for kv_fp8 in (False, True):  # both cache kinds compiled and run before anything is measured
        engine.kv = KVCacheConfig.for_serving("cuda", "fp8" if kv_fp8 else "dtype")
        result[f"warmup_{'fp8kv' if kv_fp8 else 'bf16kv'}_s"] = warm_up_dit(engine, [(height, width)]).seconds
    resident = resident_model_bytes("cuda", engine.dit)
    result["resident_gib"] = resident / GIB

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        slim = [{k: v for k, v in s.items() if k != "latents"} for s in result["scenarios"]]
        args.out.write_text(json.dumps({**result, "scenarios": slim}, indent=2) + "\n")

    for sc in scenarios(args.card_gib, args.window_chunks):
        if args.only and sc.name not in args.only:
            continue
        r = run_scenario(engine, sc, resident, height, width)
        result["scenarios"].append(r)
        if sc.kv_fp8:  # the same share and attention with the exact cache ran before
            twin = next((s for s in result["scenarios"] if not s["kv_fp8"] and s["card_gib"] == sc.card_gib
                         and s["share"] == sc.share and s["full_attention"] == sc.full_attention), None)
            if twin and twin["latents"] and r["latents"]:
                r["latent_deviation_vs_bf16kv"] = deviation(r["latents"], twin["latents"])
        times = r["chunk_s"]
        print(f"{sc.name:32s} budget {r['budget_gib']:6.2f} GiB, held {r['held_gib']:5.2f} + {r['working_gib']:4.2f} "
              f"GiB: admitted {r['admitted']}, ran {r['ran']}, oom {r['oom'] is not None}, one more fits "
              f"{r.get('one_more_fits')}, peak {r['peak_gib']:.2f} GiB, chunks "
              f"{' '.join(f'{t:.2f}' for t in times)}", flush=True)
        if "latent_deviation_vs_bf16kv" in r:
            print("    FP8 KV deviation per chunk: " + " ".join(f"{d:.2e}" for d in r["latent_deviation_vs_bf16kv"]))
        save()
    exact_full = [s for s in result["scenarios"] if not s["kv_fp8"] and s["full_attention"] and s["latents"]]
    if len(exact_full) >= 2:  # the same session twice with the exact cache: bf16's run-to-run noise floor
        result["bf16kv_run_to_run_deviation"] = deviation(exact_full[1]["latents"], exact_full[0]["latents"])
        print("bf16 KV run to run (noise floor): " + " ".join(f"{d:.2e}" for d in result["bf16kv_run_to_run_deviation"]))
        save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
