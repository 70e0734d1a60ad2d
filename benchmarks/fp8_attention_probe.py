"""cuDNN's FP8 SDPA against its bf16 SDPA at the DiT's self-attention shapes, on one GPU:

    python -m benchmarks.fp8_attention_probe --out $OUT/fp8_attention.json

One chunk's queries (4524 tokens at 464x832, 40 heads of 128) against the key lengths of the
81-frame run's chunks 1, 3, 5 and 7 (7 chunks = the windowed steady state's 21 latent frames).
Per length: bf16 cuDNN SDPA (the fast block's `attend`), `CudnnFp8Attention.codes` as the DiT
with FP8 GEMMs calls it (per-tensor quantization of Q, K, V included; O stays e4m3), the same
dequantized to bf16, the FP8 kernel alone on pre-quantized inputs, the quantization alone;
TFLOP/s at 4 S n H D FLOPs; norm-relative errors against a float32 SDPA of the same bf16 inputs,
for random inputs and for sharper attention (queries x4), beside the error the FP8 GEMM path
already has there (the bf16 attention's output quantized per row for the output projection).
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention_probe import HEAD_DIM, HEADS, TOKENS, bench, rel
from model.accel.fp8_attention import CudnnFp8Attention
from model.accel.kernels import attend, quantize_rows

KV_CHUNKS = (1, 3, 5, 7)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float32 SDPA, a few heads at a time (the float32 score matrix of 40 heads does not fit)."""
    outs = []
    for h in range(0, HEADS, 8):
        args = (x[:, :, h:h + 8].float().transpose(1, 2) for x in (q, k, v))
        outs.append(F.scaled_dot_product_attention(*args).transpose(1, 2))
    return torch.cat(outs, dim=2).flatten(2)


def probe_length(chunks: int, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(chunks)
    n = chunks * TOKENS
    q = torch.randn(1, TOKENS, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, n, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
    flops = 4 * TOKENS * n * HEADS * HEAD_DIM
    row: dict = {"kv_tokens": n}
    t = bench(lambda: attend(q, k, v, "cudnn"))
    row["bf16_cudnn"] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
    fp8 = CudnnFp8Attention()
    t0 = time.perf_counter()
    fp8.graph(TOKENS, n, HEADS, HEAD_DIM, device)
    row["graph_build_ms"] = (time.perf_counter() - t0) * 1e3
    t = bench(lambda: fp8.codes(q, k, v))
    row["fp8_codes"] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
    t = bench(lambda: fp8(q, k, v))
    row["fp8_bf16_out"] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
    t = bench(lambda: [fp8._quantize(x) for x in (q, k, v)])
    row["fp8_quantize_ms"] = t * 1e3
    # the kernel alone: the graph executed on codes made once
    g, tensors, ws = fp8.graph(TOKENS, n, HEADS, HEAD_DIM, device)
    (qc, dq), (kc, dk), (vc, dv) = (fp8._quantize(x) for x in (q, k, v))
    ds, ss = fp8._p_scales(device)
    so = 1.0 / dv
    o = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=device)
    amax = torch.empty(2, 1, device=device)
    work = torch.empty(max(ws, 1), dtype=torch.uint8, device=device)
    handle = fp8._handle(device)
    buffers = dict(zip(tensors, (qc, kc, vc, dq, dk, dv, ds, ss, so, o, amax[0], amax[1])))
    t = bench(lambda: g.execute(buffers, work, handle=handle))
    row["fp8_kernel"] = {"ms": t * 1e3, "tflops": flops / t / 1e12, "workspace_mib": ws / 2**20}
    for name, scale in (("random", 1.0), ("sharp_q_x4", 4.0)):
        qs = (q.float() * scale).to(torch.bfloat16)
        ref = reference(qs, k, v)
        out = attend(qs, k, v, "cudnn")
        codes, scales = quantize_rows(out)
        row[f"err_{name}"] = {"fp8": rel(fp8(qs, k, v), ref), "bf16_cudnn": rel(out, ref),
                              "bf16_cudnn_rows_quantized": rel(codes.float() * scales, ref)}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="fp8_attention.json")
    args = p.parse_args()
    device = torch.device("cuda")
    res: dict = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                 "device": torch.cuda.get_device_name(device)}
    try:
        import cudnn
        res["cudnn_frontend"] = cudnn.__version__
        res["cudnn_backend"] = cudnn.backend_version()
    except Exception:  # noqa: BLE001
        res["cudnn_frontend"] = traceback.format_exc(limit=3)
    for chunks in KV_CHUNKS:
        try:
            with torch.no_grad():
                res[f"kv_{chunks}_chunks"] = row = probe_length(chunks, device)
            print(json.dumps(row), flush=True)
        except Exception:  # noqa: BLE001
            res[f"kv_{chunks}_chunks"] = {"error": traceback.format_exc(limit=8)}
            print(chunks, res[f"kv_{chunks}_chunks"]["error"], flush=True)
            break
        finally:
            torch.cuda.empty_cache()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
