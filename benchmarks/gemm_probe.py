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
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention_probe import bench

TOKENS = 4524
SHAPES = {"qkv": (5120, 15360), "o_proj": (5120, 5120), "ffn_up": (5120, 13824), "ffn_down": (13824, 5120)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    default = torch.backends.cuda.preferred_blas_library()  # what the DiT runs with
    print(f"default BLAS library: {default}", flush=True)
    for name, (k, n) in SHAPES.items():
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "default_blas": str(default),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
