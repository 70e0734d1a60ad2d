"""The model-path benchmark on one device, in one command:

    python -m benchmarks.run --preset lingbot-world-fast --frames 81 --out $OUT/bench.json

Builds the models with random weights directly on the device, then, stage by stage:
ceilings (bf16 matmul, copy), a float32 reference DiT run (numerics), the plain bf16 path,
the fast path (flash / cuDNN attention, then compiled regions), the VAE variants against
float32, the end-to-end chunk loop (T5 -> VAE encode -> DiT -> decode -> fMP4) with the
time to first chunk, and FP8 GEMMs last (it changes the weights). Every stage's results are
written to the JSON file as soon as it ends; a stage that fails is recorded and the run goes
on; stages that would start after --budget-s seconds are skipped. A table is printed last.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.build import Inputs, make_inputs, random_text_engine
from benchmarks.measure import GIB, PeakMemory, chunk_flops, copy_tbps, matmul_tflops, module_bytes, timed
from benchmarks.report import print_report
from benchmarks.sessions import DiTRun, run_dit, run_end_to_end
from benchmarks.vae_check import compare, norm_rel_err, run_vae
from deployments.replicas.memory import CARD_BYTES_ENV, cap_process, device_total_bytes
from model.accel import AccelOptions, enable_fp8, optimize_dit, optimize_vae
from model.accel.fp8_attention import append_codes
from model.config import preset as get_preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.session import frame_tokens
from model.vae.model import init_vae_random

SEED = 1234
VAE_VARIANTS = {
    "bf16": AccelOptions(),
    "bf16_channels_last": AccelOptions(vae_channels_last=True),
    "bf16_channels_last_compiled": AccelOptions(vae_channels_last=True, vae_compile=True),
    # round 2: conv inputs written once (padding inside the conv), then conv biases folded
    "bf16_compiled_pad_in_conv": AccelOptions(vae_channels_last=True, vae_compile=True, vae_pad_in_conv=True),
    "bf16_compiled_pad_in_conv_fold_bias": AccelOptions(vae_channels_last=True, vae_compile=True,
                                                        vae_pad_in_conv=True, vae_fold_bias=True),
    "bf16_compiled_write_once": AccelOptions(vae_channels_last=True, vae_compile=True, vae_pad_in_conv=True,
                                             vae_fold_bias=True, vae_write_once=True),
    # session 4: a chunk's frames in one encoder / decoder call (on top of fold_bias)
    "bf16_compiled_fold_bias_batched": AccelOptions(vae_channels_last=True, vae_compile=True, vae_pad_in_conv=True,
                                                    vae_fold_bias=True, vae_batch_frames=True),
    # and the decoder's upsample + conv3x3 as one low-resolution conv with a pixel shuffle
    "bf16_compiled_batched_upsample_in_conv": AccelOptions(vae_channels_last=True, vae_compile=True,
                                                           vae_pad_in_conv=True, vae_fold_bias=True,
                                                           vae_batch_frames=True, vae_upsample_in_conv=True),
    # the same with 2x2 phase kernels (16 of the 36 multiplies)
    "bf16_compiled_batched_upsample_2x2": AccelOptions(vae_channels_last=True, vae_compile=True, vae_pad_in_conv=True,
                                                       vae_fold_bias=True, vae_batch_frames=True,
                                                       vae_upsample_in_conv=True, vae_upsample_kernel=2),
}
# session 8: and the encoder's first conv (3 input channels) as one Triton kernel, then also the
# downsamplings' one-sided pad inside a 4x4 conv (what the GPU replicas run)
VAE_VARIANTS["bf16_compiled_batched_2x2_triton_stem"] = replace(VAE_VARIANTS["bf16_compiled_batched_upsample_2x2"],
                                                                vae_triton_stem=True)
VAE_VARIANTS["bf16_compiled_batched_2x2_stem_down"] = replace(VAE_VARIANTS["bf16_compiled_batched_2x2_triton_stem"],
                                                              vae_downsample_in_conv=True)


class Bench:
    """State shared by the stages, and the results written after each one."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.cfg = get_preset(args.preset)
        h, w = (int(v) for v in args.max_area.split("*"))
        self.inputs: Inputs = make_inputs(args.frames, h * w)
        self.t0 = time.perf_counter()
        self.results: dict = {"config": {
            "preset": args.preset, "frames": args.frames, "height": self.inputs.height,
            "width": self.inputs.width, "chunks": self.inputs.chunks, "device": self._device_name(),
            "torch": torch.__version__, "numerics_chunks": args.numerics_chunks,
            "residual_init": args.residual_init, "memory_cap_gib": self._cap_memory(args.memory_gib),
        }, "stages": {}}
        self.dit: torch.nn.Module | None = None
        self.reference: DiTRun | None = None
        self.eager_numerics: DiTRun | None = None
        self.fast: DiTRun | None = None
        self.best_fast: str | None = None
        self.best_options: AccelOptions | None = None
        self.kv = KVCacheConfig()  # the sessions' caches (the FP8 variants' code cache)
        self.text: TextEngine | None = None
        self.vae: VaeEngine | None = None

    def _cap_memory(self, gib: float | None) -> float | None:
        """Hold this process to `gib` GiB of the card (an 80 GB card's run on a larger one), as a
        replica holds itself on a card that size: `LWF_CARD_BYTES` and `cap_process`
        (deployments/replicas/memory.py). None: all of it."""
        if gib is None or self.device.type != "cuda":
            return None
        os.environ[CARD_BYTES_ENV] = str(int(gib * GIB))
        cap_process("cuda", 1.0)
        return gib

    def card_bytes(self) -> int:
        """The card's memory this process may use: its cap (--memory-gib) or the whole card."""
        return device_total_bytes("cuda")

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def frame_seqlen(self) -> int:
        return frame_tokens(self.inputs.height, self.inputs.width)

    def stage(self, name: str, fn: Callable[[], dict]) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed > self.args.budget_s:
            self.results["stages"][name] = {"skipped": f"budget: {elapsed:.0f} s elapsed"}
            print(f"[{elapsed:6.1f}s] {name}: skipped (budget)", flush=True)
            return
        print(f"[{elapsed:6.1f}s] {name} ...", flush=True)
        try:
            out = fn()
        except Exception:  # a benchmark edge: record the failure, run the other stages
            out = {"error": traceback.format_exc(limit=8)}
            print(out["error"], flush=True)
        out["stage_s"] = time.perf_counter() - self.t0 - elapsed
        self.results["stages"][name] = out
        self.save()
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {name} done: "
              f"{json.dumps(_brief(out))[:600]}", flush=True)

    def save(self) -> None:
        path = Path(self.args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.results, indent=1, default=float))

    # ---- helpers ----
    def ceiling(self) -> float | None:
        return self.results["stages"].get("ceilings", {}).get("bf16_matmul_tflops")

    def series(self, run: DiTRun, skip_final: bool) -> dict:
        """Per-chunk times, totals and MFU against the measured matmul ceiling."""
        n = len(run.chunk_s)
        flops = [chunk_flops(self.cfg.dit, self.frame_seqlen(), k,
                             calls=4 if (skip_final and k == n - 1) else 5) for k in range(n)]
        ceiling = self.ceiling()
        out = {"chunk_s": run.chunk_s, "total_s": run.total_s, "mean_chunk_s": run.total_s / n,
               "tflops_per_s": [f / t / 1e12 for f, t in zip(flops, run.chunk_s)]}
        if ceiling:
            out["mfu_vs_measured_matmul"] = sum(flops) / run.total_s / 1e12 / ceiling
        if run.memory:
            out["memory_gib"] = run.memory
        return out

    def numerics(self, engine: DiTEngine) -> dict:
        """Chunk latents of the numerics session against the float32 reference (and the plain
        bf16 path), and the first DiT call's output (identical inputs) against float32."""
        assert self.reference is not None
        run = run_dit(engine, self.inputs, self.args.numerics_chunks, trace_first=True)
        errs = [norm_rel_err(a, b) for a, b in zip(run.latents, self.reference.latents)]
        out = {"rel_err_vs_fp32": errs, "max_rel_err_vs_fp32": max(errs),
               "first_call_rel_err_vs_fp32": norm_rel_err(run.first_velocity, self.reference.first_velocity),
               "finite": all(bool(torch.isfinite(t).all()) for t in run.latents)}
        if self.eager_numerics is None:
            self.eager_numerics = run
        else:
            out["rel_err_vs_eager_bf16"] = [norm_rel_err(a, b) for a, b in
                                            zip(run.latents, self.eager_numerics.latents)]
        return out

    def engine(self, skip_final: bool) -> DiTEngine:
        assert self.dit is not None
        return DiTEngine(self.dit, skip_final_update=skip_final, kv=self.kv, append_codes=append_codes)

    def ensure_dit(self) -> None:
        """The bf16 DiT when the float32 reference stage was skipped (no numerics then)."""
        if self.dit is None:
            self.dit = init_dit_random(self.cfg.dit, torch.bfloat16, self.device, SEED,
                                       residual_scaled=self.args.residual_init)


def _brief(out: dict) -> dict:
    return {k: v for k, v in out.items() if k not in ("error",) and not isinstance(v, (list, dict))}


# ---- stages ----

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


def _fast_stage(b: Bench, options: AccelOptions, label: str, numerics: bool, repeats: int) -> dict:
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


def _restore_best(b: Bench) -> None:
    """The later stages run the fastest exact variant measured so far."""
    if b.best_options is not None:
        optimize_dit(b.dit, b.best_options)


def stage_fast_flash(b: Bench) -> dict:
    return _fast_stage(b, AccelOptions(fast=True, attention="flash", skip_final_update=True), "fast_flash",
                       numerics=False, repeats=1)


def stage_fast_cudnn(b: Bench) -> dict:
    return _fast_stage(b, AccelOptions(fast=True, attention="cudnn", skip_final_update=True), "fast_cudnn",
                       numerics=True, repeats=2)


def _self_time_key(device: torch.device) -> str:
    return "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"


def _top_ops(prof: object, device: torch.device, path: Path, rows: int) -> dict:
    events = prof.key_averages()
    key = _self_time_key(device)
    path.write_text(events.table(sort_by=key, row_limit=40))
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:rows]
    return {"self_time_total_ms": sum(getattr(e, key) for e in events) / 1e3,
            "top": [{"op": e.key, "ms": getattr(e, key) / 1e3, "calls": e.count} for e in top]}


def _profiler(record_shapes: bool = False) -> object:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=activities, record_shapes=record_shapes)


def profile_vae(engine: VaeEngine, inputs: Inputs, latents: list[torch.Tensor], path: Path) -> dict:
    """Device time per op of the second chunk's conditioning encode and decode; beside `path`
    the same per (op, input shapes) (`*_shapes.txt`: which layers the copies belong to)."""
    from torch.profiler import record_function

    path.parent.mkdir(parents=True, exist_ok=True)
    session = engine.open(inputs.image, inputs.height, inputs.width)
    engine.condition(session)
    engine.decode_float(session, latents[0])
    with _profiler(record_shapes=True) as prof:
        with record_function("vae_encode"):
            engine.condition(session)
        with record_function("vae_decode"):
            engine.decode_float(session, latents[1])
    engine.close(session)
    _write_shapes_table(prof, engine.device, path)
    return _top_ops(prof, engine.device, path, 15)


def _write_shapes_table(prof: object, device: torch.device, path: Path) -> None:
    """The profile per (op, input shapes) beside `path` (`*_shapes.txt`): which layer a copy or
    a slow kernel belongs to (the profiler must have recorded shapes)."""
    by_shape = prof.key_averages(group_by_input_shape=True)
    path.with_name(path.stem + "_shapes.txt").write_text(by_shape.table(
        sort_by=_self_time_key(device), row_limit=80, max_name_column_width=40, max_shapes_column_width=120))


def stage_profile(b: Bench) -> dict:
    """Device time per op over a 2-chunk session of the current fast path (table in profile.txt)."""
    engine = b.engine(skip_final=True)
    with _profiler() as prof:
        run_dit(engine, b.inputs, 2)
    return _top_ops(prof, b.device, Path(b.args.out).with_name("profile.txt"), 25)


KERNEL_KINDS = (  # (kind, substrings of a device kernel's name), first match wins
    ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma", "cublas")),
    ("attention", ("sdpa", "fmha", "flash", "attn", "attention")),
    ("compiled", ("triton_",)),
    ("copy", ("memcpy", "memset", "copy", "cat")),
    ("elementwise", ("elementwise", "reduce", "norm")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def device_time_by_kind(events) -> dict[str, float]:
    """Seconds of device time per kernel kind in profiler averages: the device's own events only
    (kernels, copies, memsets). The device-side ranges of annotations (inductor's `## Call
    CompiledFxGraph`, `record_function`) span kernels counted already and are left out."""
    kinds: dict[str, float] = {}
    for e in events:
        # `is_user_annotation` may be missing in older profilers; inductor's ranges are "## ... ##"
        annotation = getattr(e, "is_user_annotation", False) or e.key.startswith("## ")
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0 and not annotation:
            kinds[kernel_kind(e.key)] = kinds.get(kernel_kind(e.key), 0.0) + e.self_device_time_total / 1e6
    return kinds


def device_busy_s(prof: object) -> float:
    """Seconds during which at least one kernel, copy or memset ran (from the profile's trace)."""
    import tempfile

    from benchmarks.probes.gaps import idle_gaps

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        busy_us, _, _ = idle_gaps(json.loads(trace.read_text())["traceEvents"], math.inf)
    return busy_us / 1e6


def profile_report(prof: object, device: torch.device, path: Path, shapes: object | None = None) -> dict:
    """Write `prof`'s per-op table at `path` and the per (op, input shapes) one beside it (from
    `shapes`, a profile that recorded them; else `prof`); device time per kernel kind and busy time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=_self_time_key(device), row_limit=60))
    _write_shapes_table(prof if shapes is None else shapes, device, path)
    return {"device_s_by_kind": device_time_by_kind(prof.key_averages()), "device_busy_s": device_busy_s(prof)}


def _profile_by_kind(b: Bench, filename: str) -> dict:
    """The current path's device time by kernel kind over a 2-chunk session, and how busy the
    device was (kernel time / wall time: < 1 means the host left it idle)."""
    engine = b.engine(skip_final=True)
    run_dit(engine, b.inputs, 2)  # warm
    with _profiler() as prof:
        run, wall = timed(lambda: run_dit(engine, b.inputs, 2), b.device)
    with _profiler(record_shapes=True) as shaped:  # apart: recording shapes slows the host
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
        out = _fast_stage(b, options, label, numerics=True, repeats=2)
    finally:
        _restore_best(b)
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


def stage_pipeline(b: Bench) -> dict:
    """VAE variants against float32, then the end-to-end chunk loop with the fastest one."""
    assert b.fast is not None
    dev, args = b.device, b.args
    # On an 80 GB card the bf16 DiT, a bf16 T5 and the VAE's float32 reference do not fit together
    # (the H100 ran out of memory here): the T5 in int8 there, as serve_config.gpu.yaml serves it.
    int8 = b.card_bytes() < 100 * GIB if dev.type == "cuda" else False
    (text, t_text) = timed(lambda: random_text_engine(b.cfg.t5, torch.bfloat16, str(dev), SEED + 1, int8), dev)
    vae32, t_vae = timed(lambda: init_vae_random(b.cfg.vae, torch.float32, dev, SEED + 2), dev)
    out: dict = {"build_s": {"t5": t_text, "vae": t_vae}, "dit_variant": b.best_fast, "t5_int8": int8}
    latents = b.fast.latents
    best_name, best_engine = _vae_variants(b, vae32, latents, out)
    del vae32
    out["vae_variant"] = best_name
    out["vae_profile"] = profile_vae(best_engine, b.inputs, latents[:2], Path(args.out).with_name("vae_profile.txt"))
    b.text, b.vae = text, best_engine
    out.update(_end_to_end(b, args.e2e_repeats))
    out["resident_gib"] = {"t5": module_bytes(text.encoder.model) / GIB,
                           "vae": module_bytes(best_engine.vae) / GIB, "dit": module_bytes(b.dit) / GIB}
    return out


def _vae_variants(b: Bench, vae32: torch.nn.Module, latents: list[torch.Tensor], out: dict) -> tuple:
    """The float32 VAE streams, then each --vae-variants variant against them (into `out`);
    returns the fastest variant's (name, engine)."""
    dev, args = b.device, b.args
    ref = run_vae(VaeEngine(vae32), b.inputs, latents)
    out["vae_fp32"] = {"encode_s": ref.encode_s, "decode_s": ref.decode_s}
    variants = {name: options for name, options in VAE_VARIANTS.items() if name in args.vae_variants}
    best_name, best_engine, best_time = None, None, math.inf
    for name, options in variants.items():
        try:  # building it too: a variant this device cannot run (a Triton kernel on the CPU) is recorded
            engine = VaeEngine(optimize_vae(copy.deepcopy(vae32).to(torch.bfloat16), options))
            _, t_warm = timed(lambda: run_vae(engine, b.inputs, latents[:3]), dev)  # cuDNN autotuning, compile
            with PeakMemory(dev) as mem:
                run = run_vae(engine, b.inputs, latents)
        except Exception:  # one failing variant must not cost the end-to-end run
            out[f"vae_{name}"] = {"error": traceback.format_exc(limit=6)}
            continue
        per_chunk = (sum(run.encode_s) + sum(run.decode_s)) / len(latents)
        out[f"vae_{name}"] = {"warmup_3chunks_s": t_warm, "encode_s": run.encode_s, "decode_s": run.decode_s,
                              "peak_above_start_gib": (mem.peak - mem.start) / GIB,
                              "mean_encode_s": sum(run.encode_s) / len(latents),
                              "mean_decode_s": sum(run.decode_s) / len(latents), **compare(run, ref)}
        if per_chunk < best_time:
            best_name, best_engine, best_time = name, engine, per_chunk
    if best_engine is None:
        raise RuntimeError(f"no VAE variant of {sorted(variants)} ran on {dev}: see their errors")
    return best_name, best_engine


def stage_vae_only(b: Bench) -> dict:
    """--vae-only: the VAE variants on seeded random latents of a session's shape (no DiT)."""
    dev, args = b.device, b.args
    vae32, t_vae = timed(lambda: init_vae_random(b.cfg.vae, torch.float32, dev, SEED + 2), dev)
    gen = torch.Generator().manual_seed(SEED + 3)
    shape = (b.cfg.vae.z_dim, 3, b.inputs.height // 8, b.inputs.width // 8)
    latents = [torch.randn(shape, generator=gen) for _ in range(b.inputs.chunks)]
    out: dict = {"build_s": {"vae": t_vae}, "latents": "random N(0, 1)"}
    best_name, best_engine = _vae_variants(b, vae32, latents, out)
    out["vae_variant"] = best_name
    out["vae_profile"] = profile_vae(best_engine, b.inputs, latents[:2], Path(args.out).with_name("vae_profile.txt"))
    return out


def _end_to_end(b: Bench, repeats: int) -> dict:
    dit = b.engine(skip_final=True)
    run_end_to_end(b.text, b.vae, dit, b.inputs)  # warm-up session
    with PeakMemory(b.device) as mem:
        runs = [run_end_to_end(b.text, b.vae, dit, b.inputs) for _ in range(repeats)]
    e2e = min(runs, key=lambda r: sum(r.chunk_totals()))
    totals = e2e.chunk_totals()
    return {"process_peak_gib": mem.peak / GIB, "e2e": {
        "stages": e2e.stages, "chunk_total_s": totals, "mean_chunk_s": sum(totals) / len(totals),
        "session_open": e2e.session_open, "time_to_first_chunk_s": e2e.first_chunk_s,
        "ttfc_repeats_s": [r.first_chunk_s for r in runs], "payload_bytes": e2e.payload_bytes}}


def stage_pipeline_compiled(b: Bench) -> dict:
    """The end-to-end loop again when the compiled DiT was kept."""
    if b.best_fast not in ("fast_cudnn_compile",) or b.vae is None:
        return {"note": "compiled DiT not kept; nothing to rerun"}
    if "vae_variant" not in b.results["stages"].get("pipeline", {}):  # the pipeline stage failed: its error says why
        return {"note": "the pipeline stage did not finish; nothing to rerun"}
    return {"dit_variant": b.best_fast, "vae_variant": b.results["stages"]["pipeline"]["vae_variant"],
            **_end_to_end(b, 1)}


FP8_ATTENTION = {"attention": "cudnn_fp8"}
FP8_VARIANTS = (  # (name, bias in the GEMM epilogue, fp8_quant, fp8_fast_accum, fp8_camera, other AccelOptions
    # and "kv_codes": the sessions' caches as the FP8 attention's codes, KVCacheConfig "fp8_codes"),
    # one change each (no attention among the others: the exact run's backend; triton_rope only
    # where named: run I's two last variants both ran it, inherited from the kept exact variant)
    ("fp8_bias_add", False, "gemm", False, False, {}),  # round 1's FP8 path (the baseline)
    ("fp8_bias_epilogue", True, "gemm", False, False, {}),
    ("fp8_fused_quant", True, "fused", False, False, {}),
    ("fp8_fused_quant_fast_accum", True, "fused", True, False, {}),
    ("fp8_triton_quant_fast_accum", True, "triton", True, False, {}),
    # session 5: the self-attention as cuDNN's FP8 SDPA (model/accel/fp8_attention.py)
    ("fp8_triton_quant_fast_accum_fp8_attention", True, "triton", True, False, FP8_ATTENTION),
    # session 6: its cache in its own codes (model/dit/kv_codes.py); session 7: Q and K by their bounds
    ("fp8_triton_quant_fast_accum_fp8_attention_codes", True, "triton", True, False, FP8_ATTENTION | {"kv_codes": True}),
    ("fp8_triton_quant_fast_accum_fp8_attention_codes_bound", True, "triton", True, False,
     FP8_ATTENTION | {"kv_codes": True, "qk_bound_scales": True}),
    ("fp8_triton_quant_fast_accum_fp8_attention_codes_bound_rope", True, "triton", True, False,
     FP8_ATTENTION | {"kv_codes": True, "qk_bound_scales": True, "triton_rope": True}),
    ("fp8_triton_quant_fast_accum_camera", True, "triton", True, True, {}),  # last: releases the camera weights
)


def _set_bias_epilogue(dit: torch.nn.Module, on: bool) -> None:
    for block in dit.blocks:
        for proj in block.fp8_projections():
            proj.bias_epilogue = on


def triton_quant_check(device: torch.device, tokens: int, dim: int, ffn_dim: int) -> dict:
    """The Triton quantization kernels against the compiled-region functions they replace, at
    the DiT's shapes: the scales' largest relative difference and the fraction of e4m3 codes
    that differ (rounding at a code boundary), per kernel."""
    from model.accel import kernels as kn
    from model.accel import triton_quant as tq

    gen = torch.Generator(device=device).manual_seed(5)
    r = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, device=device, generator=gen).to(dtype)  # noqa: E731
    x, attn, cross, h = r(1, tokens, dim, dtype=torch.float32) * 4, r(1, tokens, dim), r(1, tokens, dim), r(tokens, ffn_dim)
    scale, shift, gate = r(1, 1, dim, dtype=torch.float32) * 0.1, r(1, 1, dim, dtype=torch.float32) * 0.1, r(1, 1, dim, dtype=torch.float32)
    cam = r(1, tokens, 2 * dim)
    w, bias = r(dim, dtype=torch.float32), r(dim, dtype=torch.float32) * 0.1
    cases = {
        "quantize_rows": lambda m: m.quantize_rows(attn),
        "gelu_quantize": lambda m: m.gelu_quantize(h),
        "modulated_norm_q": lambda m: m.modulated_norm_q(x, scale, shift, 1e-6, torch.bfloat16),
        "modulated_norm_q_bf16_residual": lambda m: m.modulated_norm_q(x.bfloat16(), scale, shift, 1e-6, torch.bfloat16),
        "attn_camera_norm_q": lambda m: m.attn_camera_norm_q(x, attn, gate, *cam.chunk(2, dim=-1), w, bias, 1e-6,
                                                             torch.bfloat16),
        "cross_residual_norm_q": lambda m: m.cross_residual_norm_q(x, cross, scale, shift, 1e-6, torch.bfloat16),
    }
    out = {}
    for name, fn in cases.items():
        a, b = fn(tq), fn(kn)
        res = {}
        if isinstance(a[1], tuple):  # (residual, (codes, scales))
            res["residual_max_abs_diff"] = (a[0] - b[0]).abs().max().item()
            a, b = a[1], b[1]
        res["scale_max_rel_diff"] = ((a[1] - b[1]).abs() / b[1]).max().item()
        res["code_mismatch_fraction"] = (a[0].view(torch.uint8) != b[0].view(torch.uint8)).float().mean().item()
        out[name] = res
    return out


def _build_fp8_attention_graphs(b: Bench) -> float:
    """Build the FP8 attention's cuDNN graph for each key length the run reaches (a serving
    replica builds one per new length on first use); returns the seconds it took."""
    cfg, tokens = b.cfg.dit, b.frame_seqlen() * 3
    fp8 = b.dit.blocks[0].kernels.fp8_attention
    t0 = time.perf_counter()
    for chunk in range(b.inputs.chunks):
        fp8.graph(tokens, (chunk + 1) * tokens, cfg.num_heads, cfg.dim // cfg.num_heads, b.device)
    return time.perf_counter() - t0


def stage_fp8(b: Bench) -> dict:
    """FP8 GEMMs (opt-in), one change at a time (FP8_VARIANTS); each variant's times, its error
    against float32 and against the fastest exact bf16 run; the fastest stays for the later
    stages."""
    assert b.dit is not None and b.fast is not None and b.best_options is not None
    bf16_latents = b.fast.latents
    _, t_q = timed(lambda: enable_fp8(b.dit), b.device)
    out: dict = {"quantize_s": t_q}
    best: tuple[float, AccelOptions, bool, str, KVCacheConfig] | None = None
    for name, epilogue, quant, fast_accum, camera, others in FP8_VARIANTS:
        if name not in b.args.fp8_variants:
            continue
        others = dict(others)
        b.kv = KVCacheConfig("fp8_codes" if others.pop("kv_codes", False) else "dtype")
        options = replace(b.best_options, fp8=True, fp8_quant=quant, fp8_fast_accum=fast_accum, fp8_camera=camera,
                          **{"attention": b.best_options.attention, "qk_bound_scales": False,
                             "triton_rope": False, **others})
        if quant == "triton" and "triton_quant_check" not in out:
            try:
                cfg = b.cfg.dit
                out["triton_quant_check"] = triton_quant_check(b.device, b.frame_seqlen() * 3, cfg.dim, cfg.ffn_dim)
            except Exception:  # the check is a report: the variant runs anyway
                out["triton_quant_check"] = {"error": traceback.format_exc(limit=6)}
        try:
            optimize_dit(b.dit, options)
            _set_bias_epilogue(b.dit, epilogue)
            if options.attention == "cudnn_fp8":  # the cuDNN graphs of every key length, untimed
                out[f"{name}_graph_build_s"] = _build_fp8_attention_graphs(b)
            engine = b.engine(skip_final=True)
            _, t_warm = timed(lambda: run_dit(engine, b.inputs, 1), b.device)
            num = b.numerics(engine) if b.reference is not None else {}
            run = run_dit(engine, b.inputs, b.inputs.chunks)
        except Exception:  # one failing variant must not cost the others
            out[name] = {"error": traceback.format_exc(limit=8)}
            print(out[name]["error"], flush=True)
            continue
        vs_bf16 = [norm_rel_err(a, c) for a, c in zip(run.latents, bf16_latents)]
        out[name] = {"warmup_1chunk_s": t_warm, **num, **b.series(run, skip_final=True),
                     "rel_err_vs_fast_bf16_per_chunk": vs_bf16}
        print(f"  {name}: {run.total_s:.3f} s, vs bf16 {max(vs_bf16):.2e}", flush=True)
        if best is None or run.total_s < best[0]:
            best = (run.total_s, options, epilogue, name, b.kv)
    b.kv = KVCacheConfig()
    if best is not None:
        b.kv = best[4]
        optimize_dit(b.dit, best[1])
        _set_bias_epilogue(b.dit, best[2])
        out["fastest"] = best[3]
    return out


STAGES: dict[str, Callable[[Bench], dict]] = {
    "ceilings": stage_ceilings,
    "reference_fp32": stage_reference,
    "eager_bf16": stage_eager,
    "fast_flash": stage_fast_flash,
    "fast_cudnn": stage_fast_cudnn,
    "profile": stage_profile,
    "pipeline": stage_pipeline,
    "compile": stage_compile,
    "compile_fa4": stage_compile_fa4,
    "compile_fa4_rope": stage_compile_fa4_rope,
    "pipeline_compiled": stage_pipeline_compiled,
    "profile_compiled": stage_profile_compiled,
    "fp8": stage_fp8,
    "profile_fp8": stage_profile_fp8,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast", choices=["lingbot-world-fast", "tiny"])
    p.add_argument("--frames", type=int, default=81, help="video frames (12k - 3)")
    p.add_argument("--max-area", default="480*832", help="output pixel budget, as h*w")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="bench.json")
    p.add_argument("--numerics-chunks", type=int, default=3)
    p.add_argument("--residual-init", action="store_true",
                   help="DiT output projections at std 0.02/sqrt(2 layers) (docs/PERFORMANCE.md, Numerics)")
    p.add_argument("--e2e-repeats", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=480.0, help="start no stage after this many seconds")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="cap the process at this many GiB of the card (on a larger card, 78.5: an H100 80GB's "
                        "memory less its CUDA context)")
    p.add_argument("--skip", nargs="*", default=[], choices=list(STAGES), help="stages to leave out")
    p.add_argument("--vae-only", action="store_true",
                   help="only the VAE variants, on random latents (no DiT, no T5): stage vae_only")
    p.add_argument("--fp8-variants", nargs="*", default=[v[0] for v in FP8_VARIANTS],
                   choices=[v[0] for v in FP8_VARIANTS], help="stage fp8's variants (in FP8_VARIANTS' order)")
    p.add_argument("--vae-variants", nargs="*", default=list(VAE_VARIANTS), choices=list(VAE_VARIANTS))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device; use --device cpu with --preset tiny")
    bench = Bench(args)
    with torch.no_grad():  # the engines enter inference mode themselves
        stages = {"vae_only": stage_vae_only} if args.vae_only else STAGES
        for name, fn in stages.items():
            if name not in args.skip:
                bench.stage(name, lambda fn=fn: fn(bench))
    bench.results["wall_s"] = time.perf_counter() - bench.t0
    bench.save()
    print_report(bench.results)


if __name__ == "__main__":
    main()
