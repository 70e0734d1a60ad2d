"""Ulysses sequence-parallel DiT benchmark: per-chunk time on N devices and the all-to-all share.

    torchrun --standalone --nproc-per-node 4 -m benchmarks.sp_bench --out $OUT/sp4.json
    for n in 1 2 4 8; do torchrun --standalone --nproc-per-node $n -m benchmarks.sp_bench \
        --out $OUT/sp$n.json; done      # N = 1 is the plain single-device engine (baseline)

Every rank builds the DiT with the same seeded random weights (or loads --checkpoint) on its
device, applies the serving speed transforms (`AccelOptions.for_serving`), then
`apply_ulysses`, and streams one session of --frames video frames (81 -> 7 chunks) at
--max-area as a live stream (length not declared, so every chunk makes its 5 DiT calls): the
wall time of each chunk with all ranks synchronised before it. The last chunk runs under
torch.profiler: the time of the communication kernels (NCCL on GPUs, gloo ops on the CPU) as
a share of that chunk, all-to-all and all-gather apart. With --check,
rank 0 then replays the session on the single-device engine (same weights and inputs) and
reports the latents' relative error. Rank 0 prints the results and writes --out (JSON).
A CPU smoke run: `torchrun --nproc-per-node 2 -m benchmarks.sp_bench --device cpu
--preset tiny --dtype float32 --frames 33 --max-area 64*112 --check`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from benchmarks.build import Inputs, make_inputs
from benchmarks.measure import sync
from model.accel import AccelOptions, optimize_dit
from model.checkpoint import CheckpointLayout
from model.config import preset as get_preset
from model.dit.caches import KVCacheConfig
from model.dit.model import CausalDiT
from model.dit.loader import init_dit_random, load_dit
from model.engines import DiTEngine
from model.factory import as_dtype
from model.parallel import SequenceShard, init_sp_group, rank_device, sp_engine
from model.session import DiTSessionSpec, frame_tokens

SEED = 1234
CONTEXT_SEED, Y_SEED = 11, 12
REALTIME_CHUNK_S = 0.75  # 12 video frames at 16 fps
ALL_TO_ALLS_PER_BLOCK = 2  # q/k/v in (one, stacked), attention output back


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--checkpoint", default=None, help="released base-cam directory (default: random weights)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--max-area", default="480*832")
    p.add_argument("--local-attn-size", type=int, default=15)
    p.add_argument("--sink-size", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="torch.compile the fast block's regions")
    p.add_argument("--check", action="store_true", help="compare with the single-device engine")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args()


def build_dit(args: argparse.Namespace, device: torch.device) -> tuple[CausalDiT, AccelOptions]:
    """The DiT with random weights (seeded: the same on every rank) or the checkpoint's, sped
    up as a serving replica on `device` would be."""
    cfg = get_preset(args.preset).dit.with_window(args.local_attn_size, args.sink_size)
    dtype = as_dtype(args.dtype)
    if args.checkpoint is None:
        dit = init_dit_random(cfg, dtype, device, SEED)
    else:
        dit = load_dit(CheckpointLayout.discover(args.checkpoint), dtype, device,
                       args.local_attn_size, args.sink_size)
    options = AccelOptions.for_serving(device, compile=args.compile)
    return optimize_dit(dit, options), options


def session_spec(engine: DiTEngine, inputs: Inputs) -> DiTSessionSpec:
    return DiTSessionSpec(
        context=inputs.context(engine.cfg.text_dim, CONTEXT_SEED), height=inputs.height,
        width=inputs.width, seed=SEED, translation_scale=inputs.translation_scale,
    )


def synchronised(device: torch.device) -> None:
    sync(device)
    if dist.is_initialized():
        dist.barrier()


def stream(engine: DiTEngine, inputs: Inputs, device: torch.device) -> tuple[list[float], list[torch.Tensor], dict]:
    """One session: wall time and latents of each chunk; the last chunk runs profiled (its
    time is the profile's, not in the list)."""
    spec = session_spec(engine, inputs)
    session = engine.open(spec)
    times, latents, comm = [], [], {}
    for k in range(inputs.chunks):
        y = inputs.y(k, spec.lat_h, spec.lat_w, Y_SEED)
        poses, intrinsics = inputs.chunk_cameras(k)
        run = partial(engine.step, session, y, poses, intrinsics)
        if k == inputs.chunks - 1:
            out, comm = profile_comm(run, device)
        else:
            synchronised(device)
            t0 = time.perf_counter()
            out = run()
            sync(device)
            times.append(time.perf_counter() - t0)
        latents.append(out.latents)
    engine.close(session)
    return times, latents, comm


def profile_comm(fn, device: torch.device) -> tuple[object, dict]:
    """fn()'s result, its wall time and the time of its communication under torch.profiler (s).

    CUDA: NCCL kernels (all-to-all = SendRecv kernels, all-gather = AllGather kernels; a
    kernel's time includes waiting for the slowest rank). CPU: the gloo ops' CPU time.
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronised(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        wall = time.perf_counter() - t0
    comm = {"all_to_all": 0.0, "all_gather": 0.0, "other": 0.0}
    for e in prof.key_averages():
        name = e.key.lower()
        if device.type == "cuda":
            if not name.startswith(("nccldevkernel", "ncclkernel")):  # the kernels, not the CPU ops
                continue
            seconds = e.self_device_time_total / 1e6
        else:
            if not name.startswith("gloo:"):
                continue
            seconds = e.cpu_time_total / 1e6
        kind = ("all_to_all" if "sendrecv" in name or "all_to_all" in name or "alltoall" in name
                else "all_gather" if "allgather" in name or "all_gather" in name else "other")
        comm[kind] += seconds
    return out, {"wall_s": wall, **{f"{k}_s": v for k, v in comm.items()}}


def all_to_all_bytes(engine: DiTEngine, inputs: Inputs, world: int) -> int:
    """Bytes one rank sends through the all-to-alls of one chunk (5 DiT calls)."""
    cfg = engine.cfg
    tokens = 3 * frame_tokens(inputs.height, inputs.width)
    shard = SequenceShard(tokens, world, 0)
    per_call = cfg.num_layers * (3 + 1) * shard.size * cfg.dim * engine.dtype.itemsize * (world - 1) // world
    return 5 * per_call


def main() -> None:
    args = parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    device = rank_device(args.device)
    h, w = (int(v) for v in args.max_area.split("*"))
    inputs = make_inputs(args.frames, h * w)
    dit, options = build_dit(args, device)
    serving_kv = KVCacheConfig.for_serving(device)  # the single device's (sp_engine keeps the dtype, shifting)
    engine = DiTEngine(dit, skip_final_update=options.skip_final_update, kv=serving_kv)
    if world > 1:
        engine = sp_engine(engine, init_sp_group(rank, world, "env://", device), options)
    times, latents, comm = stream(engine, inputs, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {
        "world": world, "preset": args.preset, "device": device_name, "dtype": args.dtype, "options": repr(options),
        "size": [inputs.height, inputs.width], "frames": args.frames, "chunks": inputs.chunks,
        "window": [args.local_attn_size, args.sink_size], "chunk_s": times,
        "steady_chunk_s": statistics.median(times[1:] or times),  # the first chunk warms up
        "profiled_chunk": comm,
        "comm_share": sum(v for k, v in comm.items() if k != "wall_s") / comm["wall_s"],
        "all_to_all_share": comm["all_to_all_s"] / comm["wall_s"],
        "all_to_all_bytes_per_rank_per_chunk": all_to_all_bytes(engine, inputs, world) if world > 1 else 0,
    }
    result["realtime"] = result["steady_chunk_s"] <= REALTIME_CHUNK_S
    if world > 1:
        dist.destroy_process_group()
    if args.check and rank == 0 and world > 1:
        del engine, dit
        plain, _ = build_dit(args, device)
        _, ref, _ = stream(DiTEngine(plain, skip_final_update=options.skip_final_update, kv=serving_kv), inputs,
                           device)
        result["check_rel_err"] = [
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(latents, ref)
        ]
    if rank == 0:
        print(json.dumps(result, indent=2))
        print(f"N={world}: steady chunk {result['steady_chunk_s']:.3f} s (target {REALTIME_CHUNK_S} s: "
              f"{'met' if result['realtime'] else 'missed'}), communication {100 * result['comm_share']:.1f} % "
              f"of a chunk (all-to-all {100 * result['all_to_all_share']:.1f} %)")
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
