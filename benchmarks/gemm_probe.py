"""The DiT's per-call bf16 GEMMs at one chunk's rows, on one GPU, in one command:

    python -m benchmarks.gemm_probe --out $OUT/gemm.json

Session 8's windowed profile has cuBLAS running the fused q/k/v projection at 832 TFLOP/s, the
[5120 -> 5120] projections and the FFN's down projection at 725 and the FFN's up projection
([5120 -> 13824]) at 666. Each shape here (4524 rows: 3 latent frames at 464x832) as the fast
block calls it (`F.linear` with the bias: cuBLASLt's bias epilogue) and in other forms that
compute the same product: without the bias (`torch.mm`, the bias left to the next elementwise
pass), through the other BLAS library (`torch.backends.cuda.preferred_blas_library`), the output
split in two halves of N, and the rows padded to a multiple of 256. Per row: TFLOP/s (the best
of a few timed rounds).

`--autotune` adds inductor's max-autotune GEMMs (Triton templates, the persistent TMA one
included, against cuBLAS): the linear with its bias, and for the FFN's up projection the linear,
bias and tanh GELU as one compiled function (the GELU in the GEMM's epilogue when a template
wins) against the fast block's linear then eager GELU. Each row records the error against a
float32 product of the same bf16 operands.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention_probe import bench, rel

TOKENS = 4524
SHAPES = {"qkv": (5120, 15360), "o_proj": (5120, 5120), "ffn_up": (5120, 13824), "ffn_down": (13824, 5120)}


def autotuned_rows(name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, flops: int) -> list[dict]:
    """Inductor's max-autotune forms of one GEMM (and of the FFN's up projection with its GELU)."""
    import torch._inductor.config as inductor_config
    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    inductor_config.triton.enable_persistent_tma_matmul = True
    rows = []
    ref = F.linear(x.float(), w.float(), b.float())
    forms = {"linear + bias": (lambda a: F.linear(a, w, b), ref)}
    if name == "ffn_up":
        forms["linear + bias + gelu"] = (lambda a: F.gelu(F.linear(a, w, b), approximate="tanh"),
                                         F.gelu(ref, approximate="tanh"))
        eager = lambda: F.gelu(F.linear(x, w, b), approximate="tanh")  # noqa: E731
        t = bench(eager, iters=20)
        rows.append({"gemm": name, "variant": "eager linear + bias + gelu (the fast block's)", "us": t * 1e6,
                     "tflops": flops / t / 1e12, "err": rel(eager(), forms["linear + bias + gelu"][1])})
    for label, (fn, want) in forms.items():
        compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
        try:
            t0 = time.perf_counter()
            got = compiled(x)
            tune_s = time.perf_counter() - t0
            t = bench(lambda: compiled(x), iters=20)
            rows.append({"gemm": name, "variant": f"max-autotune {label}", "us": t * 1e6, "tflops": flops / t / 1e12,
                         "tune_s": tune_s, "err": rel(got, want)})
        except Exception as e:  # noqa: BLE001
            rows.append({"gemm": name, "variant": f"max-autotune {label}", "error": repr(e)[:300]})
    for r in rows:
        print(f"{name:9s} {r['variant']:46s} " + (f"{r['us']:8.1f} us {r['tflops']:6.0f} TFLOP/s err {r['err']:.2e}"
              if "us" in r else r["error"]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--autotune", action="store_true", help="add inductor's max-autotune GEMMs")
    p.add_argument("--only", nargs="+", choices=sorted(SHAPES), help="these GEMMs only")
    args = p.parse_args()
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    default = torch.backends.cuda.preferred_blas_library()  # what the DiT runs with
    print(f"default BLAS library: {default}", flush=True)
    for name, (k, n) in SHAPES.items():
        if args.only and name not in args.only:
            continue
        x = torch.randn(TOKENS, k, device=dev, generator=gen).to(bf16)
        w = (torch.randn(n, k, device=dev, generator=gen) * k ** -0.5).to(bf16)
        b = (torch.randn(n, device=dev, generator=gen) * 0.02).to(bf16)
        pad = torch.zeros(-TOKENS % 256 + TOKENS, k, device=dev, dtype=bf16)
        pad[:TOKENS] = x
        halves = w.chunk(2), b.chunk(2)
        flops = 2 * TOKENS * k * n
        variants = {
            "linear + bias (the fast block's)": lambda: F.linear(x, w, b),
            "mm, no bias": lambda: torch.mm(x, w.t()),
            "linear + bias, rows padded to 256": lambda: F.linear(pad, w, b),
            "linear + bias, N in two halves": lambda: [F.linear(x, wh, bh) for wh, bh in zip(*halves)],
        }
        for label, fn in variants.items():
            for library in ("cublaslt", "cublas"):
                torch.backends.cuda.preferred_blas_library(library)
                try:
                    t = bench(fn, iters=20)
                    rows.append({"gemm": name, "variant": label, "blas": library, "us": t * 1e6,
                                 "tflops": flops / t / 1e12})
                    print(f"{name:9s} {label:36s} {library:9s} {t * 1e6:8.1f} us {flops / t / 1e12:6.0f} TFLOP/s",
                          flush=True)
                except Exception as e:  # noqa: BLE001
                    rows.append({"gemm": name, "variant": label, "blas": library, "error": repr(e)[:300]})
        torch.backends.cuda.preferred_blas_library(default)
        if args.autotune:
            rows += autotuned_rows(name, x, w, b, flops)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "default_blas": str(default),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
