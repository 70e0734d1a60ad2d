"""Attention kernels at the DiT's shapes (the `model.attention` option), on one GPU:

    python -m benchmarks.probes.attention --bf16 --out $OUT/attention.json

The FP8 rows (always; `--bf16` adds the bf16 kernels' before them): cuDNN's FP8 SDPA from the
code cache's e4m3 codes against 1, 3, 5 (the served window) and 6 chunks of keys: the graph
the model builds, each execution plan cuDNN offers for it, and the same with Q, K, V, O
heads-major; FlashAttention-3's FP8 forward on the same codes and descales (`fa3_fp8`, the
model's `Fa3Fp8Attention`: O in bf16). One chunk's queries (3 latent frames, 4524 tokens at
464x832, 40 heads of 128) against the key/value lengths a session sees (the chunk alone,
chunks 0-2, the served window of 15 latent frames = 5 chunks, 18 latent frames = 6 chunks).
Per kernel: TFLOP/s (4 S n H D FLOPs, the best of a few timed runs) and the error of its
output against a float32 SDPA on the same bf16 inputs (norm-relative).
Kernels: PyTorch SDPA with the cuDNN and the flash backend; FlashAttention's CuTe DSL kernels
(`flash_attn.cute`, the flash-attn-4 wheel: FA3-class on sm_90; a row with its import error
where it is not installed: `FA4=1 bash benchmarks/fetch_wheels.sh` fetches it); FlashAttention-3's
forward (`fa3`: the fa3-fwd wheel, .whlfa3 of benchmarks/fetch_wheels.sh, with a CUDA 13 torch;
an error row where it does not import). One device call, carry [".whlfa3"]:
    python3 benchmarks/install_wheels.py .whlfa3 /tmp/site && PYTHONPATH=/tmp/site:$PWD \
      python3 -m benchmarks.probes.attention --bf16 --out $OUT/attention.json
(The Triton attention kernel and the GEMM / quantisation / VAE-conv probes of issue 18 are in
git history: docs/PERFORMANCE.md's dead ends.)
"""
from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.accel.fa3_attention import Fa3Fp8Attention, attend_fa3
from model.accel.fa4_attention import attend_fa4

TOKENS = 4524  # 3 latent frames x 29 x 52 patches
HEADS, HEAD_DIM = 40, 128
KV_CHUNKS = (1, 3, 5, 6)  # 5: the served window (15 latent frames: 22620 keys)


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


def attention_rows(device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    out: dict = {}
    for chunks in KV_CHUNKS:
        n = chunks * TOKENS
        # cache-like layout: [n, H, D] rows; q as the fast block makes it ([S, H, D] contiguous)
        q = torch.randn(TOKENS, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        k = torch.randn(n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        v = torch.randn(n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        flops = 4 * TOKENS * n * HEADS * HEAD_DIM
        ref = sdpa(q.float(), k.float(), v.float(), SDPBackend.MATH if n <= 4 * TOKENS else None)
        row: dict = {"kv_tokens": n}
        kernels = {"cudnn": lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION),
                   "flash": lambda: sdpa(q, k, v, SDPBackend.FLASH_ATTENTION),
                   "fa4": lambda: fa4(q, k, v),  # fa4's first call compiles the kernel (a warm-up call)
                   "fa3": lambda: attend_fa3(q[None], k[None], v[None])[0]}
        for name, fn in kernels.items():
            try:
                t = bench(fn)
                row[name] = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(fn(), ref)}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[-300:]}
        out[f"kv_{chunks}_chunks"] = row
        print(json.dumps(row), flush=True)
        del q, k, v, ref
    return out


FP8_KV_CHUNKS = (1, 3, 5, 6)  # 5: the served window (15 latent frames: 22620 keys)


def fp8_rows(device: torch.device, kv_chunks: tuple[int, ...] = FP8_KV_CHUNKS) -> dict:
    """cuDNN's FP8 SDPA (`attention: cudnn_fp8`) at the same shapes, from e4m3 codes as the code
    cache holds them: the graph the model builds (the heuristic's first plan), every other plan
    cuDNN offers for it (`all_plans`), and Q, K, V, O heads-major instead of the cache's rows.
    The error is O's (codes x scale) against a float32 SDPA of the dequantized codes."""
    from model.accel.fp8_attention import CudnnFp8Attention, quantize_tensor

    attention = CudnnFp8Attention()
    gen = torch.Generator(device=device).manual_seed(1)
    out: dict = {}
    for chunks in kv_chunks:
        n = chunks * TOKENS
        qc, kc, vc = (quantize_tensor(torch.randn(1, length, HEADS, HEAD_DIM, device=device, generator=gen)
                                      .to(torch.bfloat16)) for length in (TOKENS, n, n))
        flops = 4 * TOKENS * n * HEADS * HEAD_DIM
        deq = [c.float() * scale for c, scale in (qc, kc, vc)]
        ref = sdpa(*(x[0] for x in deq), SDPBackend.MATH if n <= 4 * TOKENS else None)
        row: dict = {"kv_tokens": n}

        def served():
            codes, scales = attention.codes(qc, kc, vc)
            return (codes.float() * scales)[0]

        try:  # an error row where the cuDNN frontend is missing (the FA3 row still runs)
            t = bench(served)
            row["model_graph"] = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(served(), ref)}
        except Exception as e:  # noqa: BLE001
            row["model_graph"] = {"error": repr(e)[-300:]}
        fa3 = lambda: Fa3Fp8Attention()(qc, kc, vc)[0]  # noqa: E731  (descales [1] -> FA3's [1, H])
        try:
            t = bench(fa3)
            row["fa3_fp8"] = {"tflops": flops / t / 1e12, "ms": t * 1e3, "err": rel(fa3(), ref)}
        except Exception as e:  # noqa: BLE001
            row["fa3_fp8"] = {"error": repr(e)[-300:]}
        for layout in ("rows", "heads_major"):
            heads_major = layout == "heads_major"
            try:
                handle = attention._handle(device)
                g, tensors, _ = attention._build(TOKENS, n, HEADS, HEAD_DIM, device, heads_major=heads_major,
                                                 all_plans=True)
                q, k, v = ((c.transpose(1, 2).contiguous(), scale) if heads_major else (c, scale)
                           for c, scale in (qc, kc, vc))
                o = torch.empty_like(q[0])
                pack = attention.variant_pack(tensors, q, k, v, o)
                plans = []
                for index in range(g.get_execution_plan_count()):
                    try:
                        ws = torch.empty(max(int(g.get_workspace_size_plan_at_index(index)), 1), dtype=torch.uint8,
                                         device=device)
                        t = bench(lambda: g.execute_plan_at_index(pack, ws, index, handle=handle))
                        o_rows = o.transpose(1, 2) if heads_major else o
                        err = rel((o_rows.float() * vc[1])[0].flatten(1), ref)
                        plans.append({"plan": index, "tflops": flops / t / 1e12, "ms": t * 1e3, "err": err})
                    except Exception as e:  # noqa: BLE001
                        plans.append({"plan": index, "error": repr(e)[-200:]})
                row[layout] = plans
            except Exception as e:  # noqa: BLE001
                row[layout] = {"error": repr(e)[-300:]}
        out[f"kv_{chunks}_chunks"] = row
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="attention.json")
    p.add_argument("--bf16", action="store_true", help="also the bf16 kernels' rows (before the FP8 ones)")
    p.add_argument("--kv-chunks", default=",".join(map(str, FP8_KV_CHUNKS)),
                   help="the FP8 rows' key lengths, in chunks (5: the served window)")
    args = p.parse_args()
    device = torch.device("cuda")
    res: dict = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                 "device": torch.cuda.get_device_name(device)}
    kv_chunks = tuple(int(c) for c in args.kv_chunks.split(","))
    fp8 = lambda device: fp8_rows(device, kv_chunks)  # noqa: E731
    for name, rows in (("attention", attention_rows), ("fp8_attention", fp8))[0 if args.bf16 else 1:]:
        try:
            with torch.no_grad():
                res[name] = rows(device)
        except Exception:  # noqa: BLE001
            res[name] = {"error": traceback.format_exc(limit=6)}
            print(res[name]["error"], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
