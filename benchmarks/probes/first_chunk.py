"""Why the first session after a start waits longer for its first chunk (issue 35: first TTFC
1.46 s against 1.09 s for the next session on the H200, its chunk 0's DiT call 0.93 s against
0.63 s): the DiT engine as a replica runs it, without Serve.

    python -m benchmarks.probes.first_chunk --fp8 --fp8-attention --out first_chunk.json

The engine with a replica's options (`AccelOptions.for_serving`, compiled, the ring window),
warmed up as a replica's constructor does (`model.warmup.warm_up_dit`), then sessions opened
one after the other, each closed before the next, every call on the one model thread (as
deployments/replicas/compute_thread.py): first one with the warm-up's own inputs (zero
conditioning and context, `model.warmup.warm_camera`), then --sessions with a prompt-like
context, random conditioning and a camera that also moves sideways.
Per session and chunk: the step's seconds (device synchronised; the cache update deferred and
timed apart, as a replica does), and the process counters that moved during it
(deployments/replicas/stall_counters.py: compiled graphs, cudaMalloc / cudaFree, allocator
retries). A first chunk slower in the first realistic session than in the next names a one-off
that the warm-up misses; the counters say which kind.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np
import torch

from benchmarks.probes import cli
from deployments.replicas import stall_counters
from model.accel import AccelOptions
from model.dit.caches import KVCacheConfig
from model.factory import load_dit_engine
from model.session import DiTSessionSpec
from model.warmup import warm_camera, warm_up_dit


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _inputs(k: int, lat: tuple[int, int], size: tuple[int, int], still: bool, gen: torch.Generator):
    """Chunk k's y [20, 3, lh, lw], poses [N, 4, 4], intrinsics [N, 4]: the warm-up's own (zero
    conditioning, `warm_camera`) or a session's (random conditioning, the camera moving sideways
    too: values the warm-up never sent)."""
    poses, intrinsics = warm_camera(k, *size)
    if still:
        return torch.zeros(20, 3, *lat), poses, intrinsics
    poses[:, 0, 3] += 0.02 * np.arange(len(poses))
    return torch.randn(20, 3, *lat, generator=gen), poses, intrinsics


def _session(engine, device: str, size: tuple[int, int], chunks: int, still: bool, seed: int,
             context_len: int) -> dict[str, Any]:
    h, w = size
    gen = torch.Generator().manual_seed(seed)
    context = torch.zeros(8, engine.cfg.text_dim) if still else torch.randn(context_len, engine.cfg.text_dim, generator=gen)
    t = time.perf_counter()
    session = engine.open(DiTSessionSpec(context=context, height=h, width=w, seed=seed))
    _sync(device)
    out: dict[str, Any] = {"inputs": "warm-up's" if still else "moving camera", "open_s": time.perf_counter() - t,
                           "chunks": []}
    defer = engine.capabilities.deferred_update
    try:
        for k in range(chunks):
            y, poses, intrinsics = _inputs(k, (h // 8, w // 8), size, still, gen)
            before = stall_counters.snapshot(device)
            _sync(device)
            t = time.perf_counter()
            engine.step(session, y, poses, intrinsics, defer_update=defer)
            _sync(device)
            step_s = time.perf_counter() - t
            t = time.perf_counter()
            if defer:
                engine.finish_chunk(session)
            _sync(device)
            out["chunks"].append({"step_s": round(step_s, 4), "update_s": round(time.perf_counter() - t, 4),
                                  "moved": stall_counters.moved(before, stall_counters.snapshot(device))})
    finally:
        engine.close(session)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    device, size = args.device, args.size
    options = AccelOptions.for_serving(device, compile=args.compile, fp8=args.fp8, fp8_attention=args.fp8_attention)
    kv = KVCacheConfig.for_serving(device, fp8_attention=args.fp8_attention)
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")  # a replica's one model thread
    call = lambda fn, *a: thread.submit(fn, *a).result()  # noqa: E731
    t = time.perf_counter()
    engine = call(lambda: load_dit_engine(args.preset, None, args.dtype, device, local_attn_size=args.window,
                                          sink_size=args.sink, random_weights=True, kv=kv, options=options))
    load_s = time.perf_counter() - t
    warm = call(warm_up_dit, engine, [size])
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device, "size": list(size),
        "fp8": args.fp8, "fp8_attention": args.fp8_attention, "compile": args.compile, "window": args.window,
        "load_s": round(load_s, 3), "warmup_s": round(warm.seconds, 3), "sessions": []}
    plan = [True] + [False] * args.sessions
    for i, still in enumerate(plan):
        result["sessions"].append(call(_session, engine, device, size, args.chunks, still, 100 + i, args.context_len))
    thread.shutdown()
    return result


def main(argv: Optional[list[str]] = None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--sessions", type=int, default=2, help="realistic sessions after the warm-up-like one")
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--context-len", type=int, default=64, help="text tokens of the realistic sessions' context")
    args = p.parse_args(argv)
    return cli.emit(run(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
