"""Does `attention: fa3` compute what `cudnn` computes on the GPU (issue 44 item 2)? One device call:

    python3 benchmarks/install_wheels.py .whlfa3 /tmp/site && PYTHONPATH=/tmp/site:$PWD \\
      python3 -m benchmarks.probes.fa3_check --out $OUT/fa3_check.json     # carry [".whlfa3"]

1. The kernel: FA3's FP8 forward (`Fa3Fp8Attention`) at the DiT's heads (40 x 128) on e4m3 codes
   with three different per-tensor descales, against a float32 SDPA of the dequantized codes:
   a descale mapped to the wrong operand, or FA3 reading the [1, H] descales otherwise than
   broadcast, shows as an error near 1 instead of ~3e-2. bf16 likewise, against float32.
2. The model: a DiT of the released dims (dim 5120, 40 heads of 128, the served window of 15
   latent frames with a sink of 3) with `--layers` blocks (2: the whole model's per-block work,
   in seconds) and seeded random weights (the benchmark's residual-scaled init), one open-ended
   464x832 session of `--chunks` chunks (the window fills after 5 and rolls) through the
   serving engine's options (`AccelOptions.for_serving`, its caches `KVCacheConfig.for_serving`),
   with the same inputs per variant: bf16 `cudnn`, bf16 `fa3`, FP8 (FP8 GEMMs + the FP8
   self-attention over its code cache with the bound scales) `cudnn` (cuDNN's graph) and `fa3`
   (FA3's FP8), and the float32 plain path (same weights) as the reference. Reported: each
   variant's chunk latents against the float32 reference and fa3 against cudnn at the same
   precision (norm-relative and max abs error, per chunk and all together), which kernel each
   block ran, and the mean step seconds of the chunks after the first (a hint, not the served
   figure: that is `benchmarks.window --attention fa3` or the served configs).
   `ok`: fa3's error against float32 at most 1.25x cudnn's + 1e-3 (bf16), and FP8 fa3's at most
   cudnn FP8's x 1.25 (FA3 writes O in bf16, cuDNN in e4m3: expected lower).

Exits 1 (with the JSON) when FA3 cannot run here or a check fails.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model.accel import AccelOptions, optimize_dit
from model.config import DiTConfig
from model.accel.fa3_attention import Fa3Fp8Attention, attend_fa3, available, importable
from model.accel.fp8_attention import append_codes, quantize_tensor
from model.config import preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.session import DiTSessionSpec
from model.warmup import warm_camera

SIZE = (464, 832)
SEED = 20261206


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _sdpa32(q, k, v) -> torch.Tensor:
    """float32 attention of [1, S, H, D] x [1, n, H, D] -> [1, S, H*D]."""
    args = (x.float().transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(*args).transpose(1, 2).flatten(2)


def kernel_check(device: torch.device, s: int = 1508, n: int = 4524, h: int = 40, d: int = 128) -> dict:
    """(s, n: a latent frame's queries against a chunk's keys.)"""
    gen = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(1, length, h, d, device=device, generator=gen).mul(c)
               for length, c in ((s, 1.0), (n, 0.3), (n, 5.0)))  # three scales: a swapped descale shows
    coded = [quantize_tensor(x.bfloat16()) for x in (q, k, v)]
    fp8 = Fa3Fp8Attention()(*coded)
    ref = _sdpa32(*(c.float() * dsc for c, dsc in coded))
    bf = [x.bfloat16() for x in (q, k, v)]
    out = {"fp8": {"dtype": str(fp8.dtype), "err_vs_f32_of_codes": rel(fp8, ref),
                   "descales": [float(dsc) for _, dsc in coded]},
           "bf16": {"err_vs_f32": rel(attend_fa3(*bf), _sdpa32(*bf))}}
    out["ok"] = out["fp8"]["err_vs_f32_of_codes"] < 0.06 and out["bf16"]["err_vs_f32"] < 1e-2
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def session_latents(engine: DiTEngine, chunks: int, seed: int, size: tuple[int, int]
                    ) -> tuple[list[torch.Tensor], list[float]]:
    """The chunks' latents (float32, host) and step seconds of one open-ended session."""
    height, width = size
    device = next(engine.dit.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    context = torch.randn(64, engine.cfg.text_dim, generator=gen)
    session = engine.open(DiTSessionSpec(context=context, height=height, width=width, seed=seed))
    latents, seconds = [], []
    try:
        for k in range(chunks):
            y = torch.randn(20, 3, height // 8, width // 8, generator=gen)
            poses, intrinsics = warm_camera(k, height, width)
            poses[:, 0, 3] += 0.02 * np.arange(len(poses))
            _sync(device)
            t = time.perf_counter()
            step = engine.step(session, y, poses, intrinsics)
            _sync(device)
            seconds.append(time.perf_counter() - t)
            latents.append(step.latents.float().cpu())
    finally:
        engine.close(session)
    return latents, seconds


def compare(got: list[torch.Tensor], want: list[torch.Tensor]) -> dict:
    g, w = torch.cat(got, dim=1), torch.cat(want, dim=1)
    return {"rel": rel(g, w), "max_abs": float((g - w).abs().max()),
            "per_chunk_rel": [round(rel(a, b), 6) for a, b in zip(got, want)]}


def serving_options(device: torch.device, compile: bool, fp8: bool, attention: str) -> AccelOptions:
    """A replica's options (`model.fp8` and `model.fp8_attention` both `fp8`)."""
    return AccelOptions.for_serving(device, compile=compile, fp8=fp8, fp8_attention=fp8, attention=attention)


def model_check(device: torch.device, cfg: DiTConfig, chunks: int, compile: bool = False,
                size: tuple[int, int] = SIZE, options_for=serving_options) -> dict:
    dit = init_dit_random(cfg, torch.bfloat16, device, SEED, residual_scaled=True)
    ref_dit = copy.deepcopy(dit).float()
    ref, _ = session_latents(DiTEngine(ref_dit, kv=KVCacheConfig()), chunks, SEED, size)  # float32 plain path
    del ref_dit
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out: dict = {"layers": cfg.num_layers, "chunks": chunks, "compile": compile, "size": list(size), "variants": {}}
    runs: dict[str, list[torch.Tensor]] = {}
    # bf16 first: FP8 GEMMs release the bf16 weights (enable_fp8), so they come after
    for name, fp8, attention in (("bf16_cudnn", False, "cudnn"), ("bf16_fa3", False, "fa3"),
                                 ("fp8_cudnn", True, "cudnn"), ("fp8_fa3", True, "fa3")):
        options = options_for(device, compile, fp8, attention)
        kv = KVCacheConfig.for_serving(device, fp8_attention=fp8)
        options.check_cache(kv)
        engine = DiTEngine(optimize_dit(dit, options), skip_final_update=options.skip_final_update, kv=kv,
                           append_codes=append_codes)
        latents, seconds = session_latents(engine, chunks, SEED, size)
        runs[name] = latents
        out["variants"][name] = {"attention": options.attention, "kv": kv.format,
                                 "block_attention": sorted({b.kernels.attention for b in dit.blocks}),
                                 "step_s_after_first": round(sum(seconds[1:]) / max(len(seconds) - 1, 1), 4),
                                 "vs_f32": compare(latents, ref)}
        print(json.dumps({name: out["variants"][name]}), flush=True)
    out["fa3_vs_cudnn"] = {p: compare(runs[f"{p}_fa3"], runs[f"{p}_cudnn"]) for p in ("bf16", "fp8")}
    err = {name: v["vs_f32"]["rel"] for name, v in out["variants"].items()}
    out["ok"] = {"bf16": err["bf16_fa3"] <= 1.25 * err["bf16_cudnn"] + 1e-3,
                 "fp8": err["fp8_fa3"] <= 1.25 * err["fp8_cudnn"],
                 "kernels": [out["variants"][n]["block_attention"] for n in out["variants"]]
                 == [["cudnn"], ["fa3"], ["cudnn_fp8"], ["fa3_fp8"]]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--chunks", type=int, default=7, help="7: the window (5 chunks) fills and rolls twice")
    p.add_argument("--compile", action="store_true", help="the compiled regions, as served (slower to start)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device"}))
        return 1
    device = torch.device("cuda")
    result: dict = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                    "capability": list(torch.cuda.get_device_capability(device)),
                    "fa3_importable": importable(), "fa3_available": available(device)}
    ok = result["fa3_available"]
    if not result["fa3_importable"]:
        try:
            import fa3_fwd_interface  # noqa: F401
        except Exception as e:  # noqa: BLE001  (why: not installed, or another CUDA / torch)
            result["fa3_import_error"] = repr(e)[-500:]
    if ok:
        with torch.no_grad():
            result["kernel"] = kernel_check(device)
            cfg = dataclasses.replace(preset("lingbot-world-fast").dit.with_window(15, 3), num_layers=args.layers)
            result["model"] = model_check(device, cfg, args.chunks, args.compile)
        ok = result["kernel"]["ok"] and all(result["model"]["ok"].values())
    result["ok"] = bool(ok)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
