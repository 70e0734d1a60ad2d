"""The DiT's stages: ceilings, the float32 reference, the plain bf16 path, the fast paths
(flash / cuDNN attention), the compiled candidates (kept only when faster), and the profiles of
the path kept."""
from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.engine.bench import SEED, Bench
from benchmarks.engine.profiling import profile_report, profiler, top_ops
from benchmarks.measure import GIB, copy_tbps, matmul_tflops, module_bytes, timed
from benchmarks.sessions import run_dit
from model.accel import AccelOptions, optimize_dit
from model.dit.loader import init_dit_random
from model.engines import DiTEngine


def stage_ceilings(b: Bench) -> dict:
    if b.device.type != "cuda":
        return {"note": "no ceilings on the CPU"}
    return {"bf16_matmul_tflops": matmul_tflops(b.device), "copy_tbps": copy_tbps(b.device)}


def stage_reference(b: Bench) -> dict:
    """float32 DiT (weights rounded to bf16 values, so both runs use the same weights) for
    the numerics chunks, then the same module converted to bf16 for every later stage."""
    torch.backends.cuda.matmul.allow_tf32 = False  # a true float32 reference
    torch.backends.cudnn.allow_tf32 = False
    dit, t_build = timed(lambda: init_dit_random(b.cfg.dit, torch.float32, b.device, SEED,
                                                   residual_scaled=b.args.residual_init), b.device)
    with torch.no_grad():
        for p in dit.parameters():
            p.copy_(p.to(torch.bfloat16))
    b.reference = run_dit(DiTEngine(dit), b.inputs, b.args.numerics_chunks, trace_first=True)
    _, t_convert = timed(lambda: dit.to(torch.bfloat16), b.device)
    b.dit = dit
    if b.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"fp32_chunk_s": b.reference.chunk_s, "fp32_build_s": t_build, "to_bf16_s": t_convert,
            "dit_weights_gib_bf16": module_bytes(dit) / GIB,
            "latent_rms": [t.pow(2).mean().sqrt().item() for t in b.reference.latents]}


def stage_eager(b: Bench) -> dict:
    engine = b.engine(skip_final=False)
    num = b.numerics(engine)
    run = run_dit(engine, b.inputs, b.inputs.chunks)
    return {**b.series(run, skip_final=False), **num}


def fast_stage(b: Bench, options: AccelOptions, label: str, numerics: bool, repeats: int) -> dict:
    b.ensure_dit()
    _, t_opt = timed(lambda: optimize_dit(b.dit, options), b.device)
    engine = b.engine(skip_final=options.skip_final_update)
    warm, t_warm = timed(lambda: run_dit(engine, b.inputs, 1), b.device)
    out: dict = {"transform_s": t_opt, "warmup_1chunk_s": t_warm}
    if numerics and b.reference is not None:
        out.update(b.numerics(engine))
    runs = [run_dit(engine, b.inputs, b.inputs.chunks) for _ in range(repeats)]
    best = min(runs, key=lambda r: r.total_s)
    out.update(b.series(best, skip_final=options.skip_final_update))
    out["repeat_totals_s"] = [r.total_s for r in runs]
    if b.fast is None or best.total_s < b.fast.total_s:
        b.fast, b.best_fast, b.best_options = best, label, options
    return out


def restore_best(b: Bench) -> None:
    """The later stages run the fastest exact variant measured so far."""
    if b.best_options is not None:
        optimize_dit(b.dit, b.best_options)


def stage_fast_flash(b: Bench) -> dict:
    return fast_stage(b, AccelOptions(fast=True, attention="flash", skip_final_update=True), "fast_flash",
                       numerics=False, repeats=1)


def stage_fast_cudnn(b: Bench) -> dict:
    return fast_stage(b, AccelOptions(fast=True, attention="cudnn", skip_final_update=True), "fast_cudnn",
                       numerics=True, repeats=2)


def stage_profile(b: Bench) -> dict:
    """Device time per op over a 2-chunk session of the current fast path (table in profile.txt)."""
    engine = b.engine(skip_final=True)
    with profiler() as prof:
        run_dit(engine, b.inputs, 2)
    return top_ops(prof, b.device, Path(b.args.out).with_name("profile.txt"), 25)


def _profile_by_kind(b: Bench, filename: str) -> dict:
    """The current path's device time by kernel kind over a 2-chunk session, and how busy the
    device was (kernel time / wall time: < 1 means the host left it idle)."""
    engine = b.engine(skip_final=True)
    run_dit(engine, b.inputs, 2)  # warm
    with profiler() as prof:
        run, wall = timed(lambda: run_dit(engine, b.inputs, 2), b.device)
    with profiler(record_shapes=True) as shaped:  # apart: recording shapes slows the host
        run_dit(engine, b.inputs, 1)
    report = profile_report(prof, b.device, Path(b.args.out).with_name(filename), shapes=shaped)
    return {"wall_s": wall, "chunk_s": run.chunk_s, **report, "busy_fraction": report["device_busy_s"] / wall}


def stage_profile_compiled(b: Bench) -> dict:
    """The fastest exact path by kernel kind (profile_compiled.txt)."""
    return _profile_by_kind(b, "profile_compiled.txt")


def stage_profile_fp8(b: Bench) -> dict:
    """The fastest FP8 variant by kernel kind (profile_fp8.txt)."""
    return _profile_by_kind(b, "profile_fp8.txt")


def _candidate_stage(b: Bench, label: str, options: AccelOptions) -> dict:
    """An exact variant measured against the fastest so far; the later stages run it only if it
    is faster (a failed or slower one leaves the faster variant to them)."""
    try:
        out = fast_stage(b, options, label, numerics=True, repeats=2)
    finally:
        restore_best(b)
    out["kept"] = b.best_fast == label
    return out


def stage_compile(b: Bench) -> dict:
    return _candidate_stage(b, "fast_cudnn_compile",
                            AccelOptions(fast=True, attention="cudnn", compile=True, skip_final_update=True))


def stage_compile_fa4(b: Bench) -> dict:
    """The compiled exact path with FlashAttention's CuTe DSL kernels in place of cuDNN's
    (`attention="fa4"`; an error row where flash-attn-4 is not installed)."""
    return _candidate_stage(b, "fast_fa4_compile",
                            AccelOptions(fast=True, attention="fa4", compile=True, skip_final_update=True))


def stage_compile_fa4_rope(b: Bench) -> dict:
    """The FlashAttention stage's path with the Q / K norm + RoPE as one Triton pass per row
    (`triton_rope`, model/accel/triton_rope.py; session 7)."""
    return _candidate_stage(b, "fast_fa4_rope_compile", AccelOptions(fast=True, attention="fa4", compile=True,
                                                                     triton_rope=True, skip_final_update=True))
