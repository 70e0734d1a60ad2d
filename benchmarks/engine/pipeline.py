"""The VAE and the end-to-end stages: the VAE variants against float32 (the fastest kept), the
chunk loop T5 -> VAE encode -> DiT -> decode -> fMP4 with its time to first chunk, and the
VAE variants alone on random latents (--vae-only)."""
from __future__ import annotations

import copy
import math
import traceback
from pathlib import Path

import torch

from benchmarks.build import random_text_engine
from benchmarks.engine.bench import SEED, VAE_VARIANTS, Bench
from benchmarks.engine.profiling import profile_vae
from benchmarks.measure import GIB, PeakMemory, module_bytes, timed
from benchmarks.sessions import run_end_to_end
from benchmarks.vae_check import compare, run_vae
from model.accel import optimize_vae
from model.engines import VaeEngine
from model.vae.model import init_vae_random


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
    out.update(end_to_end(b, args.e2e_repeats))
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


def end_to_end(b: Bench, repeats: int) -> dict:
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
            **end_to_end(b, 1)}
