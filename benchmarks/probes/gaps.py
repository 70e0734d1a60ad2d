"""Where the device waits for the host: idle gaps between kernels over a 2-chunk DiT session.

    python -m benchmarks.probes.gaps --precision fp8 --out gaps.json     # one H200, ~2 min

The DiT at the released size (random weights, bf16), the serving options (fast block, cuDNN
attention, compiled regions) plus `--precision fp8` (FP8 GEMMs, inputs quantized in the
compiled regions (`--fp8-quant`), fast accumulation). One warm
session, then a profiled one (with Python stacks); from the trace: the device's busy time, every
gap between consecutive kernels, and for the largest gaps the Python frames the host was in
when it launched the kernel after the gap (what kept the device waiting). `--preset tiny
--device cpu` only checks that the script runs (no device kernels there).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.build import make_inputs
from benchmarks.sessions import run_dit
from model.accel import AccelOptions, optimize_dit
from model.accel.options import FP8_QUANT_MODES
from model.config import preset as get_preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def idle_gaps(events: list[dict], min_us: float) -> tuple[float, float, list[dict]]:
    """(busy µs, span µs, gaps >= min_us) of the device events of a chrome trace, in time order;
    a gap names the kernel after it and its correlation id (the launch that ended it)."""
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS),
                     key=lambda e: e["ts"])
    if not kernels:
        return 0.0, 0.0, []
    busy, gaps, end = 0.0, [], kernels[0]["ts"]
    for e in kernels:
        start, stop = e["ts"], e["ts"] + e["dur"]
        if start - end >= min_us:
            gaps.append({"us": start - end, "at_us": start - kernels[0]["ts"], "next": e["name"][:80],
                         "correlation": e.get("args", {}).get("correlation")})
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy, end - kernels[0]["ts"], gaps


class HostFrames:
    """The Python frames and ops enclosing a kernel's launch (by correlation id), outermost first."""

    def __init__(self, events: list[dict]) -> None:
        self.launches = {e["args"]["correlation"]: e for e in events
                         if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op",
                                                                              "user_annotation")]
        self.tid = np.array([hash(e.get("tid")) for e in host])
        self.start = np.array([e["ts"] for e in host], dtype=np.float64)
        self.stop = self.start + np.array([e.get("dur", 0) for e in host], dtype=np.float64)
        self.names = [e["name"] for e in host]

    def __call__(self, correlation: int | None, depth: int = 12) -> list[str]:
        launch = self.launches.get(correlation)
        if launch is None:
            return []
        t = launch["ts"]
        idx = np.nonzero((self.tid == hash(launch.get("tid"))) & (self.start <= t) & (self.stop >= t))[0]
        idx = sorted(idx, key=lambda i: (self.start[i], -self.stop[i]))
        names = [self.names[i] for i in idx]
        names = [n for n in names if "site-packages" not in n and "<built-in" not in n and "torch/" not in n]
        return names[-depth:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", choices=("bf16", "fp8"), default="fp8")
    p.add_argument("--fp8-quant", choices=FP8_QUANT_MODES, default="fused")
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--min-gap-us", type=float, default=20.0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=Path("gaps.json"))
    args = p.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    cfg = get_preset(args.preset)
    inputs = make_inputs(12 * args.chunks - 3, 480 * 832 if args.preset != "tiny" else 64 * 64)
    dit = init_dit_random(cfg.dit, torch.bfloat16, args.device, 1234, residual_scaled=True)
    options = AccelOptions.for_serving(args.device, compile=True)
    if args.precision == "fp8":
        options = replace(options, fp8=True, fp8_quant=args.fp8_quant, fp8_fast_accum=True)
    optimize_dit(dit, options)
    engine = DiTEngine(dit, skip_final_update=True, kv=KVCacheConfig.for_serving(args.device))
    with torch.no_grad():
        run_dit(engine, inputs, args.chunks)  # compile, warm
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities, with_stack=True) as prof:
            run = run_dit(engine, inputs, args.chunks)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    busy, span, gaps = idle_gaps(events, args.min_gap_us)
    host_frames = HostFrames(events)
    top = sorted(gaps, key=lambda g: g["us"], reverse=True)[: args.top]
    for g in top:
        g["host"] = host_frames(g["correlation"])
    by_site = Counter()
    for g in gaps:
        frames = host_frames(g["correlation"], depth=3) if g["us"] >= 100 else ["(gaps < 100 us)"]
        by_site[" > ".join(frames)] += g["us"]
    result = {"precision": args.precision, "chunk_s": run.chunk_s, "busy_us": busy, "span_us": span,
              "busy_fraction": busy / span if span else None, "gaps": len(gaps),
              "idle_in_gaps_us": sum(g["us"] for g in gaps),
              "idle_by_site_us": dict(by_site.most_common(20)), "largest": top}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "largest"}, indent=1))
    for g in top[:10]:
        print(f"{g['us']:8.0f} us at {g['at_us'] / 1e3:8.1f} ms before {g['next'][:50]}: {' > '.join(g['host'][-5:])}")


if __name__ == "__main__":
    main()
