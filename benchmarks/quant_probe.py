"""FP8 quantization kernels at the DiT's shapes, on one GPU, in one command:

    python -m benchmarks.quant_probe --out $OUT/quant.json

The five functions that turn a GEMM input into e4m3 codes and per-row scales
(`model/accel/kernels.py`), at one chunk's rows (3 latent frames, 4524 tokens at 464x832) and
the DiT's widths (5120; the FFN's 13824): each compiled with torch.compile (what the serving
path runs: fp8_quant "fused") and as the Triton kernels of `model/accel/triton_quant.py` over
their launch knobs (warps per program; the reciprocal multiply instead of the division).

Per variant: microseconds (the best of 3 rounds, CUDA events), the bandwidth that time implies
for the bytes the function must move (each input read once, each output written once) against
the device's copy rate, and the fraction of e4m3 codes that differ from the compiled function.
The question it answers (issue 18): are the Triton kernels issue-bound by the IEEE division
(139 / 91 us where bandwidth allows 25-60, round 2), or by too few warps per row?
"""
from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.attention_probe import bench
from benchmarks.measure import copy_tbps

TOKENS, DIM, FFN_DIM = 4524, 5120, 13824
WARPS = (None, 4, 8, 16, 32)  # None: the kernels' own choice (triton_quant.MEASURED)


def cases(device: torch.device) -> dict[str, tuple[str, tuple, int]]:
    """name -> (function of `model.accel.kernels` / `triton_quant` by name, its arguments, bytes moved)."""
    gen = torch.Generator(device=device).manual_seed(7)

    def r(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    x = r(1, TOKENS, DIM, dtype=torch.float32) * 4
    attn, cross, h = r(1, TOKENS, DIM), r(1, TOKENS, DIM), r(TOKENS, FFN_DIM)
    scale, shift, gate = (r(1, 1, DIM, dtype=torch.float32) * 0.1 for _ in range(3))
    cam_scale, cam_shift = r(1, TOKENS, 2 * DIM).chunk(2, dim=-1)
    w, b = r(DIM, dtype=torch.float32), r(DIM, dtype=torch.float32) * 0.1
    n = TOKENS * DIM  # elements of one [4524, 5120] tensor
    out = n + 4 * TOKENS  # its e4m3 codes (1 byte each) and float32 row scales
    return {
        "quantize_rows": ("quantize_rows", (attn,), 2 * n + out),
        "gelu_quantize": ("gelu_quantize", (h,), 3 * TOKENS * FFN_DIM + 4 * TOKENS),
        "modulated_norm_q": ("modulated_norm_q", (x, scale, shift, 1e-6, torch.bfloat16), 4 * n + out),
        "attn_camera_norm_q": ("attn_camera_norm_q", (x, attn, gate, cam_scale, cam_shift, w, b, 1e-6,
                                                      torch.bfloat16), (4 + 2 + 4 + 4) * n + out),
        "cross_residual_norm_q": ("cross_residual_norm_q", (x, cross, scale, shift, 1e-6, torch.bfloat16),
                                  (4 + 2 + 4) * n + out),
    }


def _codes(result: tuple) -> torch.Tensor:
    q = result[1] if isinstance(result[1], tuple) else result  # (residual, (codes, scales)) or (codes, scales)
    return q[0].view(torch.uint8)


def probe(device: torch.device) -> dict:
    from model.accel import kernels as kn
    from model.accel import triton_quant as tq

    copy = copy_tbps(device)
    res: dict = {"copy_tbps": copy, "shapes": {"tokens": TOKENS, "dim": DIM, "ffn_dim": FFN_DIM}}
    for name, (fn_name, args, nbytes) in cases(device).items():
        row: dict = {"bytes": nbytes, "floor_us": nbytes / (copy * 1e12) * 1e6}
        compiled = torch.compile(getattr(kn, fn_name), dynamic=False)
        want = _codes(compiled(*args))
        variants: dict[str, Callable] = {"compiled": lambda: compiled(*args)}
        for warps in WARPS:
            for reciprocal in (False, True):
                launch = tq.Launch(num_warps=warps, reciprocal=reciprocal)
                label = f"triton_w{warps or 'default'}{'_recip' if reciprocal else ''}"
                variants[label] = lambda launch=launch: getattr(tq, fn_name)(*args, launch=launch)
        for label, fn in variants.items():
            try:
                t = bench(fn, iters=20)
                got = _codes(fn())
                row[label] = {"us": t * 1e6, "tbps": nbytes / t / 1e12,
                              "code_mismatch_fraction": (got != want).float().mean().item()}
            except Exception:  # noqa: BLE001 - one launch that fails to compile must not cost the rest
                row[label] = {"error": traceback.format_exc(limit=4)}
        best = min((k for k in row if isinstance(row[k], dict) and "us" in row[k]), key=lambda k: row[k]["us"])
        row["fastest"] = best
        print(f"{name}: floor {row['floor_us']:.0f} us, compiled {row['compiled'].get('us', float('nan')):.0f} us, "
              f"fastest {best} {row[best]['us']:.0f} us", flush=True)
        res[name] = row
    return res


ROPE_LAUNCHES = [(None, 4), (None, 8), (None, 16), (512, 2), (512, 4), (512, 8), (256, 2), (256, 4)]


def rope_probe(device: torch.device) -> dict:
    """The Q / K RMSNorm + RoPE (`model/accel/triton_rope.py`) at one chunk's rows: the compiled
    region, the one-block kernel (block None) and the looped one (pairs per block) per warps."""
    from model.accel import kernels as kn
    from model.accel import triton_rope as tr

    gen = torch.Generator(device=device).manual_seed(8)
    heads, half = 40, 64
    fused = torch.randn(TOKENS, 3 * DIM, device=device, generator=gen).to(torch.bfloat16)
    t = fused[:, DIM:2 * DIM]  # k's slice of the fused projection
    weight = (torch.rand(DIM, device=device, generator=gen) + 0.5).to(torch.bfloat16)
    angles = torch.rand(TOKENS, 1, half, device=device, generator=gen) * 6.3
    cos, sin = angles.cos(), angles.sin()
    nbytes = 2 * 2 * TOKENS * DIM  # the row read once, written once (bf16)
    res: dict = {"floor_us": nbytes / (copy_tbps(device) * 1e12) * 1e6}
    compiled = torch.compile(kn.qk_norm_rope, dynamic=False)
    want = compiled(t, weight, cos, sin, 1e-6, heads)
    res["compiled_us"] = bench(lambda: compiled(t, weight, cos, sin, 1e-6, heads), iters=20) * 1e6
    for block, warps in ROPE_LAUNCHES:
        label = f"block{block or 'all'}_w{warps}"
        try:
            fn = lambda b=block, w=warps: tr._launch(t, weight, cos, sin, 1e-6, heads, None,  # noqa: E731
                                                     torch.bfloat16, block=b, warps=w)
            got = fn()
            res[label] = {"us": bench(fn, iters=20) * 1e6,
                          "mismatch_fraction": (got != want).float().mean().item()}
        except Exception:  # noqa: BLE001
            res[label] = {"error": traceback.format_exc(limit=4)}
        print(f"rope {label}: {res[label]}", flush=True)
    print(f"rope: floor {res['floor_us']:.1f} us, compiled {res['compiled_us']:.1f} us", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="quant.json")
    p.add_argument("--only", choices=["quant", "rope"], help="one of the two probes (default: both)")
    args = p.parse_args()
    device = torch.device("cuda")
    res: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    for name, fn in (("quant", probe), ("rope", rope_probe)):
        if args.only not in (None, name):
            continue
        try:
            with torch.no_grad():
                res[name] = fn(device)
        except Exception:  # noqa: BLE001
            res[name] = {"error": traceback.format_exc(limit=6)}
            print(res[name]["error"], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
