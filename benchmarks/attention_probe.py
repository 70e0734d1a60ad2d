"""Attention kernels at the DiT's shapes, on one GPU, in one command:

    python -m benchmarks.attention_probe --out $OUT/attention.json

One chunk's queries (3 latent frames, 4524 tokens at 464x832, 40 heads of 128) against the
key/value lengths a session sees (the chunk alone, chunks 0-2, the window of 18 latent
frames = 6 chunks). Per kernel: TFLOP/s (4 S n H D FLOPs, the best of a few timed runs) and
the error of its output against a float32 SDPA on the same bf16 inputs (norm-relative).
Kernels: PyTorch SDPA with the cuDNN and the flash backend; FlashAttention's CuTe DSL kernels
(`flash_attn.cute`, the flash-attn-4 wheel: FA3-class on sm_90; a row with its import error
where it is not installed: `FA4=1 bash benchmarks/fetch_wheels.sh` fetches it); the Triton kernel of
`benchmarks/triton_attention.py` in bf16 over a sweep of tile configurations, and in FP8.
Also: the FFN's up projection with GELU as two ops vs the cuBLASLt GELU epilogue.
"""
from __future__ import annotations

import argparse
import itertools
import json
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.accel.fa4_attention import attend_fa4

TOKENS = 4524  # 3 latent frames x 29 x 52 patches
HEADS, HEAD_DIM = 40, 128
KV_CHUNKS = (1, 3, 6)


def bench(fn, iters: int = 10) -> float:
    """Seconds per call: the best of 3 rounds of `iters` calls after 2 warm-ups (CUDA events)."""
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3 / iters)
    return best


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def sdpa(q, k, v, backend: SDPBackend | None) -> torch.Tensor:
    args = (q[None].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2))
    if backend is None:
        out = F.scaled_dot_product_attention(*args)
    else:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(*args)
    return out.transpose(1, 2).flatten(2)[0]


def fa4(q, k, v) -> torch.Tensor:
    """FlashAttention's CuTe DSL forward on [S, H, D] rows (its native [B, S, H, D] layout:
    no transposes) -> [S, H * D]."""
    return attend_fa4(q[None], k[None], v[None])[0]


def attention_probe(device: torch.device, sweep: str) -> dict:
    from benchmarks import triton_attention as ta

    gen = torch.Generator(device=device).manual_seed(0)
    out: dict = {}
    configs = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
               for bm, bn, w, s in itertools.product((128,), (64, 128), (4, 8), (2, 3, 4))] if sweep in ("bf16", "all") else [None]
    for chunks in KV_CHUNKS:
        n = chunks * TOKENS
        # cache-like layout: [n, H, D] rows; q as the fast block makes it ([S, H, D] contiguous)
        q = torch.randn(TOKENS, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        k = torch.randn(n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        v = torch.randn(n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        flops = 4 * TOKENS * n * HEADS * HEAD_DIM
        ref = sdpa(q.float(), k.float(), v.float(), SDPBackend.MATH if n <= 4 * TOKENS else None)
        row: dict = {"kv_tokens": n}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                t = bench(lambda: sdpa(q, k, v, backend))
                row[name] = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(sdpa(q, k, v, backend), ref)}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[:300]}
        try:
            t = bench(lambda: fa4(q, k, v))  # the first call compiles the kernel (a warm-up call)
            row["fa4"] = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(fa4(q, k, v), ref)}
        except Exception as e:  # noqa: BLE001
            row["fa4"] = {"error": repr(e)[-300:]}
        best = None
        for cfg in configs:
            key = "triton_bf16" if cfg is None else "triton_bf16_" + "_".join(f"{x}" for x in cfg.values())
            try:
                t = bench(lambda: ta.attention(q, k, v, config=cfg))
                r = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(ta.attention(q, k, v, config=cfg), ref)}
            except Exception as e:  # noqa: BLE001
                r = {"error": repr(e)[-300:]}
            row[key] = r
            if "tflops" in r and (best is None or r["tflops"] > row[best]["tflops"]):
                best = key
        row["triton_bf16_best"] = best
        fp8_configs = [None] + ([dict(BLOCK_M=128, BLOCK_N=bn, num_warps=w, num_stages=s)
                                 for bn, w, s in itertools.product((64, 128), (4, 8), (2, 3))] if sweep in ("fp8", "all") else [])
        for cfg in fp8_configs:
            key = "triton_fp8" if cfg is None else "triton_fp8_" + "_".join(f"{x}" for x in cfg.values())
            try:
                t = bench(lambda: ta.attention(q, k, v, fp8=True, config=cfg))
                qq, sq = ta.quantize_heads(q)
                kq, sk = ta.quantize_heads(k)
                vt, sv = ta.quantize_v_transposed(v)
                t_quant = bench(lambda: (ta.quantize_heads(q), ta.quantize_heads(k), ta.quantize_v_transposed(v)))
                r = {"tflops_incl_quant": flops / t / 1e12, "ms": t * 1e3, "quant_ms": t_quant * 1e3,
                     "err": rel(ta.attention(q, k, v, fp8=True, config=cfg), ref)}
            except Exception as e:  # noqa: BLE001
                r = {"error": repr(e)[-400:]}
            row[key] = r
        out[f"kv_{chunks}_chunks"] = row
        print(json.dumps({k2: (v2 if not isinstance(v2, dict) else {a: b for a, b in v2.items()})
                          for k2, v2 in row.items() if k2 in ("kv_tokens", "cudnn", "flash", "fa4", "triton_bf16",
                                                               "triton_bf16_best", "triton_fp8")}), flush=True)
        if row.get("triton_bf16_best"):
            print("best", row["triton_bf16_best"], row[row["triton_bf16_best"]], flush=True)
        del q, k, v, ref
    return out


def gelu_probe(device: torch.device) -> dict:
    x = torch.randn(TOKENS, 5120, device=device, dtype=torch.bfloat16)
    w = torch.randn(13824, 5120, device=device, dtype=torch.bfloat16) * 0.02
    b = torch.randn(13824, device=device, dtype=torch.bfloat16) * 0.02
    two = lambda: F.gelu(F.linear(x, w, b), approximate="tanh")
    fused = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
    plain = lambda: F.linear(x, w, b)
    return {"linear_ms": bench(plain) * 1e3, "linear_gelu_ms": bench(two) * 1e3,
            "addmm_gelu_epilogue_ms": bench(fused) * 1e3, "err_epilogue_vs_two": rel(fused(), two())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="attention.json")
    p.add_argument("--sweep", choices=["none", "bf16", "fp8", "all"], default="all",
                   help="tile configurations to sweep besides the shipped ones")
    args = p.parse_args()
    device = torch.device("cuda")
    res: dict = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                 "device": torch.cuda.get_device_name(device)}
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        pass
    for name, fn in (("gelu", lambda: gelu_probe(device)), ("attention", lambda: attention_probe(device, args.sweep))):
        try:
            with torch.no_grad():
                res[name] = fn()
        except Exception:  # noqa: BLE001
            res[name] = {"error": traceback.format_exc(limit=6)}
            print(res[name]["error"], flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res.get("gelu")), flush=True)


if __name__ == "__main__":
    main()
