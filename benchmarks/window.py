"""Open-ended sessions with the rolling KV window (issue 15): per-chunk DiT time and memory.

One command on an H200 (about 5 minutes: two loads of random weights and 2 x 100 chunks of
~1.3 s; the window is the GPU configs' sink 3 + local 15 latent frames):

    python -m benchmarks.window --out $OUT/window.json

One open-ended session (no `num_frames`: per-chunk noise, the window rolls from chunk 5 on)
at 464x832 steps `--chunks` chunks through the serving engine (`AccelOptions.for_serving`:
fast block, cuDNN attention; `--compile` its compiled regions, `--kv-fp8` the FP8 KV cache), in bf16 and then with FP8 GEMMs on the same weights. Per chunk:
the DiT time (camera + 4 steps + cache update, synchronised; the update deferred and timed
apart, as the served replica runs it), the memory allocated after it
and the peak during it. The summary per precision: mean and the largest deviation from it of
the chunk time once the window is full, and the spread of the allocated memory (it must be
flat: the window's caches are allocated at open and never grow). The JSON is rewritten after
every chunk, so a run cut short keeps what it measured.

`--profile` adds one steady-state chunk per precision under the profiler (device time per
kernel kind and per op, busy fraction): what a windowed chunk is made of.

CPU smoke run (the embedded tiny model): `python -m benchmarks.window --preset tiny --device cpu
--size 32*48 --chunks 8 --precisions bf16 --local 6 --sink 3 --out /tmp/window.json`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from camera import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, parse_size
from benchmarks.measure import chunk_flops_by_kind
from model.accel import AccelOptions, optimize_dit
from model.accel.options import FP8_QUANT_MODES
from model.dit.caches import KVCacheConfig
from model.factory import load_dit_engine
from model.session import DiTSessionSpec, frame_tokens

SEED = 1234
TEXT_TOKENS = 64


def dolly_chunk(k: int, step: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """12 poses moving forward along +z (OpenCV c2w) and their intrinsics (480x832 pixels)."""
    poses = np.tile(np.eye(4, dtype=np.float32), (CHUNK_VIDEO_FRAMES, 1, 1))
    poses[:, 2, 3] = step * (k * CHUNK_VIDEO_FRAMES + np.arange(CHUNK_VIDEO_FRAMES))
    intrinsics = np.tile(np.array([[500.0, 500.0, 416.0, 240.0]], dtype=np.float32), (CHUNK_VIDEO_FRAMES, 1))
    return poses, intrinsics


def _memory(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return 0, 0
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


def run_session(engine, height: int, width: int, chunks: int, record: list[dict], save,
                profile: Path | None = None, kept: list | None = None) -> dict | None:
    """One open-ended session of `chunks` chunks; appends one row per chunk to `record`.
    With `profile`, one more chunk (the steady state, not in `record`) runs under the profiler:
    its table per op goes to `profile` (per op and input shapes beside it); returns the device
    time per kernel kind and how busy the device was. `kept`: each chunk's latents appended."""
    device = engine.device
    gen = torch.Generator().manual_seed(SEED)
    context = torch.randn(TEXT_TOKENS, engine.cfg.text_dim, generator=gen)
    spec = DiTSessionSpec(context=context, height=height, width=width, seed=SEED)
    session = engine.open(spec)
    y = torch.randn(20, CHUNK_LATENT_FRAMES, height // 8, width // 8, generator=gen)
    cache_bytes = session.caches.nbytes
    try:
        for k in range(chunks):
            poses, intrinsics = dolly_chunk(k)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            latents = engine.step(session, y, poses, intrinsics, defer_update=True)  # CPU latents: synchronised
            update_s = engine.finish_chunk(session)  # the cache update, as the served replica runs it
            seconds = time.perf_counter() - t0
            allocated, peak = _memory(device)
            record.append({"chunk": k, "dit_s": seconds, "update_s": update_s,
                           "allocated_bytes": allocated, "peak_bytes": peak,
                           "cache_bytes": session.caches.nbytes, "kv_local_end": session.caches.local_end,
                           "kv_global_end": session.caches.global_end})
            if kept is not None:
                kept.append(latents.latents)
            assert session.caches.nbytes == cache_bytes, "the window's caches grew"
            print(f"chunk {k:3d}: {1000 * seconds:7.1f} ms (update {1000 * update_s:6.1f})  "
                  f"allocated {allocated / 2**30:6.2f} GiB  "
                  f"peak {peak / 2**30:6.2f} GiB", flush=True)
            save()
        if profile is not None:
            poses, intrinsics = dolly_chunk(chunks)
            return profile_chunk(lambda: engine.step(session, y, poses, intrinsics), device, profile)
        return None
    finally:
        engine.close(session)


def profile_chunk(step, device: torch.device, path: Path) -> dict:
    """Profile one call of `step` (synchronised: it returns CPU latents): device time per kernel
    kind, busy fraction (kernel time / wall), the per-op table at `path`, per shapes beside it."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.engine.profiling import profile_report

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
    report = profile_report(prof, device, path)
    return {"wall_s": wall, **report,
            "busy_fraction": report["device_busy_s"] / wall if device.type == "cuda" else None}


def kind_rates(cfg, height: int, width: int, local: int, device_s_by_kind: dict[str, float]) -> dict:
    """What the profiled chunk's GEMMs and attention compute, and at what rate: a chunk of the
    full window is 4 denoising calls + the cache update over `local` latent frames of keys (the
    chunk's own among them), the camera path once. The rates name what is left: the two kinds'
    seconds at them are the chunk's floor with every other kernel gone."""
    frame_seqlen = frame_tokens(height, width)
    flops = chunk_flops_by_kind(cfg, frame_seqlen, local * frame_seqlen)
    rates = {kind: {"tflop": f / 1e12, "device_s": device_s_by_kind.get(kind, 0.0),
                    "tflops": f / device_s_by_kind[kind] / 1e12 if device_s_by_kind.get(kind) else None}
             for kind, f in flops.items()}
    rates["floor_s"] = sum(device_s_by_kind.get(kind, 0.0) for kind in flops)
    return rates


def summarise(rows: list[dict], full_from: int) -> dict:
    """Chunk time and memory once the window is full (chunk index >= `full_from`)."""
    full = [r for r in rows if r["chunk"] >= full_from]
    if len(full) < 2:
        return {"chunks": len(rows)}
    times = [r["dit_s"] for r in full[1:]]  # the first rolling chunk also pays the first eviction copy
    mean = statistics.fmean(times)
    updates = [r["update_s"] for r in full[1:] if "update_s" in r]
    alloc = [r["allocated_bytes"] for r in full]
    return {
        "chunks": len(rows), "window_full_from_chunk": full_from,
        "mean_dit_s": mean, "max_dev_pct": 100 * max(abs(t - mean) for t in times) / mean,
        "p50_dit_s": statistics.median(times), "stdev_dit_s": statistics.pstdev(times),
        "mean_update_s": statistics.fmean(updates) if updates else None,
        "allocated_min_bytes": min(alloc), "allocated_max_bytes": max(alloc),
        "allocated_spread_bytes": max(alloc) - min(alloc),
        "peak_max_bytes": max(r["peak_bytes"] for r in full), "cache_bytes": full[-1]["cache_bytes"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="464*832", help="output H*W (exact, multiples of 16)")
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--local", type=int, default=15, help="window, latent frames (local_attn_size)")
    p.add_argument("--sink", type=int, default=3, help="sink, latent frames (sink_size)")
    p.add_argument("--precisions", default="bf16,fp8", help="comma list of bf16, fp8 (fp8 runs second: it "
                   "quantizes the same weights) and fp8 variants after it, one session each: fp8+bound (the FP8 "
                   "attention's Q and K with the bound scales, AccelOptions.qk_bound_scales); on either base: "
                   "+shift (the window shifted as the reference's, not a ring: KVCacheConfig.ring off), +rope "
                   "(the Q / K norm + RoPE as one Triton pass, AccelOptions.triton_rope, CUDA), +whole (the cache "
                   "update as the whole t = 0 call, its output discarded, not CausalDiT.write_kv)")
    p.add_argument("--compile", action="store_true", help="the compiled regions (as serve_config.gpu.yaml)")
    p.add_argument("--kv-fp8", action="store_true", help="the FP8 KV cache (model.kv_cache: fp8)")
    p.add_argument("--fp8-quant", choices=FP8_QUANT_MODES, default="gemm",
                   help="fp8: where the GEMM inputs are quantized (AccelOptions.fp8_quant)")
    p.add_argument("--fp8-fast-accum", action="store_true", help="fp8: AccelOptions.fp8_fast_accum")
    p.add_argument("--fp8-attention", action="store_true",
                   help="fp8: the self-attention as cuDNN's FP8 SDPA too (AccelOptions.attention='cudnn_fp8')")
    p.add_argument("--kv-codes", action="store_true",
                   help="fp8 with --fp8-attention: the self-attention caches as its e4m3 codes (KVCacheConfig format fp8_codes)")
    p.add_argument("--attention", choices=("cudnn", "fa4", "fa3"), default="cudnn",
                   help="the attention kernels (fa4: FlashAttention's CuTe DSL kernels, flash-attn-4; fa3: "
                   "FlashAttention-3's, fa3-fwd, with --fp8-attention its FP8 self-attention too)")
    p.add_argument("--profile", action="store_true", help="after the chunks, profile one steady-state chunk "
                   "per precision: <out>_<precision>_profile{,_shapes}.txt, by kernel kind in the JSON")
    p.add_argument("--save-latents", action="store_true", help="each chunk's latents (float32) to "
                   "<out>_<precision>_latents.pt: the deviation between runs, computed afterwards")
    p.add_argument("--out", type=Path, default=Path("window.json"))
    args = p.parse_args(argv)
    height, width = (int(s) for s in args.size.split("*"))
    assert height * width == parse_size(args.size)
    precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    random_weights = args.preset != "tiny"  # the tiny preset is the embedded model
    t0 = time.perf_counter()
    options = AccelOptions.for_serving(args.device, compile=args.compile)
    if args.attention != "cudnn":
        options = replace(options, attention=args.attention)
    engine = load_dit_engine(args.preset, None, torch.bfloat16, args.device, local_attn_size=args.local,
                             sink_size=args.sink, options=options,
                             random_weights=random_weights,
                             kv=KVCacheConfig.for_serving(args.device, "fp8" if args.kv_fp8 else "dtype"))
    result: dict = {"preset": args.preset, "device": args.device, "size": [height, width], "window":
                    [args.local, args.sink], "chunks": args.chunks, "compile": args.compile, "kv_fp8": args.kv_fp8,
                    "fp8_quant": args.fp8_quant, "fp8_fast_accum": args.fp8_fast_accum,
                    "fp8_attention": args.fp8_attention, "kv_codes": args.kv_codes, "attention": args.attention, "load_s": time.perf_counter() - t0,
                    "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "runs": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    applied = options  # what the loader gave the model
    # The window holds `local` frames: it is full after ceil(local / 3) chunks, then rolls.
    full_from = -(-args.local // CHUNK_LATENT_FRAMES)
    for precision in precisions:
        base, *variant = precision.split("+")
        if (base not in ("bf16", "fp8") or (base == "bf16" and "fp8" in result["runs"])
                or not set(variant) <= ({"rope", "whole", "shift"} | (set() if base == "bf16" else {"bound"}))):
            raise SystemExit(f"unknown or misordered precision {precision!r}")
        if "bound" in variant and not args.kv_codes:
            raise SystemExit(f"{precision}: bound is the code cache's: pass --kv-codes")
        options = replace(options, triton_rope="rope" in variant)
        kv_format = "fp8_scaled" if args.kv_fp8 else "dtype"
        if base == "fp8":
            options = replace(options, fast=True, fp8=True, fp8_quant=args.fp8_quant, fp8_fast_accum=args.fp8_fast_accum,
                              attention=(("fa3_fp8" if args.attention == "fa3" else "cudnn_fp8") if args.fp8_attention
                                         else options.attention),
                              qk_bound_scales="bound" in variant)
            kv_format = "fp8_codes" if args.kv_codes else kv_format
        # a ring with the fast block (the GPU serving options) unless the variant shifts
        engine.kv = KVCacheConfig(kv_format, ring=options.fast and "shift" not in variant and kv_format != "fp8_scaled")
        options.check_cache(engine.kv)
        if options != applied:
            optimize_dit(engine.dit, options)  # fp8: quantizes the weights once; the kernels as asked
            applied = options
        if "whole" in variant:  # the cache update as the whole t = 0 call, its output discarded (before session 9)
            engine.dit.write_kv = engine.dit.__call__
        elif "write_kv" in vars(engine.dit):
            del engine.dit.write_kv
        rows: list[dict] = []
        run = result["runs"][precision] = {"per_chunk": rows}
        run.update(triton_rope=options.triton_rope, kv_ring=engine.kv.ring)
        if base == "fp8" and args.kv_codes:
            run["qk_bound_scales"] = options.qk_bound_scales
        tag = precision.replace("+", "_")
        profile = args.out.with_name(f"{args.out.stem}_{tag}_profile.txt") if args.profile else None
        kept: list | None = [] if args.save_latents else None
        profiled = run_session(engine, height, width, args.chunks, rows, save, profile, kept)
        if kept is not None:
            torch.save(torch.stack(kept), args.out.with_name(f"{args.out.stem}_{tag}_latents.pt"))
        run["summary"] = summarise(rows, full_from)
        if profiled is not None:
            profiled["rates"] = kind_rates(engine.cfg, height, width, args.local, profiled["device_s_by_kind"])
            run["profile"] = profiled
            rates = profiled["rates"]
            print(f"{precision} profile: busy {profiled['busy_fraction']}, device s by kind "
                  f"{ {k: round(v, 4) for k, v in profiled['device_s_by_kind'].items()} }; attention "
                  f"{rates['attention']['tflops']} TFLOP/s, GEMMs {rates['gemm']['tflops']} TFLOP/s, "
                  f"their floor {rates['floor_s']:.3f} s", flush=True)
        save()
        s = run["summary"]
        if "mean_dit_s" in s:
            print(f"{precision}: {1000 * s['mean_dit_s']:.1f} ms/chunk after the window filled (cache update "
                  f"{1000 * s['mean_update_s']:.1f} ms; max deviation {s['max_dev_pct']:.1f} %), "
                  f"allocated {s['allocated_min_bytes'] / 2**30:.2f}-"
                  f"{s['allocated_max_bytes'] / 2**30:.2f} GiB, KV+cross caches {s['cache_bytes'] / 2**30:.2f} GiB",
                  flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
