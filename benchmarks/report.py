"""The benchmark's closing table (from the results dict that is also written as JSON)."""
from __future__ import annotations

DIT_VARIANTS = ("eager_bf16", "fast_flash", "fast_cudnn", "compile", "compile_fa4", "compile_fa4_rope", "fp8")
TARGETS = {  # one H200, 464x832, 81 frames: issue 7, tightened by issue 18 (DiT totals, VAE)
    "dit_total_s": 9.5, "dit_fp8_total_s": 8.0, "dit_mean_chunk_s": 1.6, "e2e_mean_chunk_s": 2.0,
    "dit_peak_gib": 64.0, "vae_decode_s": 0.10, "vae_encode_s": 0.06, "time_to_first_chunk_s": 2.5,
    "warmup_s": 120.0,
}


def dit_rows(stages: dict) -> list[tuple[str, dict]]:
    """(label, result) of every DiT variant that ran, the FP8 stage's variants one by one."""
    rows = []
    for name in DIT_VARIANTS:
        r = stages.get(name, {})
        if name == "fp8" and "total_s" not in r:
            variants = [(k, v) for k, v in r.items() if isinstance(v, dict)]
            rows.extend(variants or [(name, r)])
        else:
            rows.append((name, r))
    return rows


def _f(v: object, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"


def _e(v: object) -> str:
    return f"{v:.2e}" if isinstance(v, (int, float)) else "-"


def summary(results: dict) -> dict[str, float]:
    """The measured value of each target (absent when its stage did not run)."""
    st = results["stages"]
    fast = [st[k] for k in ("fast_cudnn", "compile", "compile_fa4", "compile_fa4_rope") if "total_s" in st.get(k, {})]
    fast = [f for f in fast if f.get("kept", True)]  # a compiled variant slower than the one before
    out: dict[str, float] = {}
    if fast:
        best = min(fast, key=lambda r: r["total_s"])
        out["dit_total_s"] = best["total_s"]
        out["dit_mean_chunk_s"] = best["mean_chunk_s"]
        if "memory_gib" in best:
            out["dit_peak_gib"] = best["memory_gib"]["peak"]
        out["warmup_s"] = best.get("transform_s", 0.0) + best.get("warmup_1chunk_s", 0.0)
    pipe = st.get("pipeline", {})
    e2e = [p["e2e"] for p in (pipe, st.get("pipeline_compiled", {})) if "e2e" in p]
    if e2e:
        best = min(e2e, key=lambda e: e["mean_chunk_s"])
        out["e2e_mean_chunk_s"] = best["mean_chunk_s"]
        out["time_to_first_chunk_s"] = best["time_to_first_chunk_s"]
    fp8 = [r for name, r in dit_rows(st) if name.startswith("fp8") and "total_s" in r]
    if fp8:
        out["dit_fp8_total_s"] = min(r["total_s"] for r in fp8)
    if "e2e" in pipe:
        vae = pipe[f"vae_{pipe['vae_variant']}"]
        out["vae_decode_s"] = vae["mean_decode_s"]
        out["vae_encode_s"] = max(vae["encode_s"])
    return out


def print_report(results: dict) -> None:
    st = results["stages"]
    cfg = results["config"]
    print(f"\n== {cfg['preset']} {cfg['height']}x{cfg['width']}, {cfg['frames']} frames, "
          f"{cfg['chunks']} chunks on {cfg['device']} (torch {cfg['torch']})")
    ce = st.get("ceilings", {})
    print(f"ceilings: bf16 matmul {_f(ce.get('bf16_matmul_tflops'), 0)} TFLOP/s, copy {_f(ce.get('copy_tbps'))} TB/s")
    chunks = cfg["chunks"]
    head = " ".join(f"c{k:<5d}" for k in range(chunks))
    print(f"\n{'DiT (s)':<28}{head} {'total':>7} {'MFU':>5} {'peak GiB':>9} {'max err fp32':>13}")
    rows = dit_rows(st)
    for name, r in rows:
        if "chunk_s" not in r:
            print(f"{name[:27]:<28}{'error' if 'error' in r else 'skipped' if 'skipped' in r else '-'}")
            continue
        cells = " ".join(f"{t:<6.3f}" for t in r["chunk_s"])
        mem = r.get("memory_gib", {}).get("peak")
        print(f"{name[:27]:<28}{cells} {r['total_s']:7.2f} {_f(r.get('mfu_vs_measured_matmul')):>5} "
              f"{_f(mem):>9} {_e(r.get('max_rel_err_vs_fp32')):>13}")
    for name, r in rows:
        mem = r.get("memory_gib")
        if mem:
            print(f"memory {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in mem.items()) + " GiB")
    pipe = st.get("pipeline") or st.get("vae_only", {})
    for name, r in rows:
        if "first_call_rel_err_vs_fp32" in r:
            vs_eager = r.get("rel_err_vs_eager_bf16")
            print(f"numerics {name}: first call {_e(r['first_call_rel_err_vs_fp32'])}, chunk latents vs fp32 "
                  + " ".join(_e(v) for v in r["rel_err_vs_fp32"])
                  + (" | vs eager bf16 " + " ".join(_e(v) for v in vs_eager) if vs_eager else ""))
    for key in ("vae_fp32", *(k for k in pipe if k.startswith("vae_bf16"))):
        v = pipe.get(key)
        if v and "encode_s" in v:
            errs = (f" enc err {_e(max(v['encode_rel_err']))} dec err {_e(max(v['decode_rel_err']))} "
                    f"uint8 max {max(v['decode_uint8_max_abs']):.0f} mean {max(v['decode_uint8_mean_abs']):.3f}"
                    if "encode_rel_err" in v else "")
            print(f"{key:<24} encode {' '.join(_f(t, 3) for t in v['encode_s'])} | "
                  f"decode {' '.join(_f(t, 3) for t in v['decode_s'])}{errs}")
    for p in (pipe, st.get("pipeline_compiled", {})):
        if "e2e" not in p:
            continue
        e = p["e2e"]
        print(f"\nend to end ({p['dit_variant']}, VAE {p['vae_variant']}): per chunk "
              + " ".join(_f(t, 3) for t in e["chunk_total_s"]) + f"  mean {_f(e['mean_chunk_s'], 3)}")
        for stage in ("vae_encode", "dit", "vae_decode", "mux"):
            print(f"  {stage:<11}" + " ".join(_f(s[stage], 3) for s in e["stages"]))
        repeats = [round(t, 3) for t in e["ttfc_repeats_s"]]
        print(f"  session open {e['session_open']}  time to first chunk {_f(e['time_to_first_chunk_s'], 3)} s "
              f"(repeats {repeats}); process peak {_f(p.get('process_peak_gib'))} GiB")
    print("\ntargets:")
    for key, value in summary(results).items():
        target = TARGETS[key]
        print(f"  {key:<24}{value:9.3f}  target <= {target:<7} {'met' if value <= target else 'NOT met'}")
    errors = [k for k, v in st.items() if "error" in v]
    if errors:
        print(f"stages with errors: {errors}")
