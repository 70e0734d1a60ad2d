"""The model-path benchmark on one device, in one command:

    python -m benchmarks.run --preset lingbot-world-fast --frames 81 --out $OUT/bench.json

Builds the models with random weights directly on the device, then, stage by stage:
ceilings (bf16 matmul, copy), a float32 reference DiT run (numerics), the plain bf16 path,
the fast path (flash / cuDNN attention, then compiled regions), the VAE variants against
float32, the end-to-end chunk loop (T5 -> VAE encode -> DiT -> decode -> fMP4) with the
time to first chunk, and FP8 GEMMs last (it changes the weights). Every stage's results are
written to the JSON file as soon as it ends; a stage that fails is recorded and the run goes
on; stages that would start after --budget-s seconds are skipped. A table is printed last.

The stages live in benchmarks/engine/ (bench.py: their shared state; dit_stages.py, pipeline.py,
fp8.py; profiling.py); this module orders them and reads the command line.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.engine.bench import VAE_VARIANTS, Bench
from benchmarks.engine.dit_stages import (stage_ceilings, stage_compile, stage_compile_fa4, stage_compile_fa4_rope,
                                          stage_eager, stage_fast_cudnn, stage_fast_flash, stage_profile,
                                          stage_profile_compiled, stage_profile_fp8, stage_reference)
from benchmarks.engine.fp8 import FP8_VARIANTS, stage_fp8, triton_quant_check
from benchmarks.engine.pipeline import stage_pipeline, stage_pipeline_compiled, stage_vae_only
from benchmarks.engine.profiling import device_busy_s, device_time_by_kind, kernel_kind, profile_report
from benchmarks.report import print_report

# what other modules and the tests import from here (benchmarks/window.py, tests/test_benchmark_reports.py)
__all__ = ["Bench", "STAGES", "device_busy_s", "device_time_by_kind", "kernel_kind", "main", "parse_args",
           "profile_report", "triton_quant_check"]


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
