"""Bench: the state the benchmark's stages share (the device, the inputs, the DiT and the runs
kept for numerics) and the results, written to the JSON file after each stage; the VAE variants
the pipeline stages measure."""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.build import Inputs, make_inputs
from benchmarks.measure import GIB, chunk_flops
from benchmarks.sessions import DiTRun, run_dit
from benchmarks.vae_check import norm_rel_err
from deployments.replicas.memory import CARD_BYTES_ENV, cap_process, device_total_bytes
from model.accel import AccelOptions
from model.accel.fp8_attention import append_codes
from model.config import preset as get_preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.session import frame_tokens

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
              f"{json.dumps(brief(out))[:600]}", flush=True)

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


def brief(out: dict) -> dict:
    return {k: v for k, v in out.items() if k not in ("error",) and not isinstance(v, (list, dict))}
