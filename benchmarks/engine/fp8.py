"""The FP8 stage: FP8 GEMMs (and the FP8 attention), one change at a time (FP8_VARIANTS), each
against float32 and the fastest exact bf16 run; the Triton quantization kernels checked against
the functions they replace."""
from __future__ import annotations

import time
import traceback
from dataclasses import replace

import torch

from benchmarks.engine.bench import Bench
from benchmarks.measure import timed
from benchmarks.sessions import run_dit
from benchmarks.vae_check import norm_rel_err
from model.accel import AccelOptions, enable_fp8, optimize_dit
from model.dit.caches import KVCacheConfig


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
