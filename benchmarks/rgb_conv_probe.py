"""The VAE's RGB convs (the encoder's first, 3 -> 96 channels; the decoder's last, 96 -> 3; both
3x3x3) at a later chunk's shape, on one GPU:

    python -m benchmarks.rgb_conv_probe --out $OUT/rgb_convs.json

One call each as the VAE makes it for a later chunk of a 464x832 session with
`vae_batch_frames`: 12 new frames and 2 cached ones, bf16, channels-last as the served VAE holds
them. Rows: cuDNN (the past concatenated first, padding inside the conv, the bias added by
PyTorch: `PaddedCausalConv3d`) and the Triton kernels of `model/accel/vae_rgb_convs.py` over a
sweep of block sizes and warps (the stem's padded buffer timed alone and with its kernel). Per
row: milliseconds (the best of a few timed rounds) and the error against a float32 conv of the
same bf16 values (norm-relative).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention_probe import bench, rel
from model.accel import vae_rgb_convs as rgb

FRAMES, PAST, HEIGHT, WIDTH, WIDE = 12, 2, 464, 832, 96


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", type=int, nargs="*", default=[64, 128, 256], help="the stem's; the head's "
                   "without the largest (its compile takes ~10 s per launch)")
    p.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    args = p.parse_args()
    dev, bf16, cl = torch.device("cuda"), torch.bfloat16, torch.channels_last_3d
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []

    def row(conv: str, name: str, fn, want: torch.Tensor | None) -> None:
        got = fn()
        s = bench(fn)
        err = None if want is None else rel(got, want)
        rows.append({"conv": conv, "kernel": name, "ms": s * 1e3, "err_vs_fp32": err})
        print(f"{conv:5s} {name:36s} {s * 1e3:7.3f} ms  err {err}", flush=True)

    for conv, c_in, c_out in (("stem", 3, WIDE), ("head", WIDE, 3)):
        x = (torch.rand(1, c_in, FRAMES, HEIGHT, WIDTH, device=dev, generator=gen) * 2 - 1).to(bf16)
        past = (torch.rand(1, c_in, PAST, HEIGHT, WIDTH, device=dev, generator=gen) * 2 - 1).to(bf16)
        x, past = x.contiguous(memory_format=cl), past.contiguous(memory_format=cl)
        weight = (torch.randn(c_out, c_in, 3, 3, 3, device=dev, generator=gen) / (27 * c_in) ** 0.5).to(bf16)
        bias = torch.randn(c_out, device=dev, generator=gen) * 0.02
        want = F.conv3d(torch.cat([past, x], 2).float(), weight.float(), bias, padding=(0, 1, 1))
        weight_cl, bias16 = weight.contiguous(memory_format=cl), bias.to(bf16)
        row(conv, "cudnn (cat + conv + bias)",
            lambda: F.conv3d(torch.cat([past, x], 2), weight_cl, bias16, padding=(0, 1, 1)), want)
        if conv == "stem":
            packed = rgb.pack_stem_weight(weight)
            buf = rgb.padded_input(x, past, 2, (1, 1))
            row(conv, "triton: padded buffer alone", lambda: rgb.padded_input(x, past, 2, (1, 1)), None)
            kernel = lambda b, w: rgb.stem_conv(buf, packed, bias, (3, 3, 3), c_out, b, w)  # noqa: E731
            row(conv, f"triton buffer + kernel {rgb.BLOCK_M}/{rgb.WARPS}",
                lambda: rgb.stem_conv(rgb.padded_input(x, past, 2, (1, 1)), packed, bias, (3, 3, 3), c_out), want)
        else:
            packed = rgb.pack_head_weight(weight)
            kernel = lambda b, w: rgb.head_conv(x, past, 2, packed, bias, (3, 3, 3), c_out, b, w)  # noqa: E731
        for block in args.blocks if conv == "stem" else args.blocks[:-1]:
            for warps in args.warps:
                try:
                    row(conv, f"triton kernel, block {block}, {warps} warps", lambda b=block, w=warps: kernel(b, w), want)
                except Exception as e:  # noqa: BLE001 (a launch that does not fit: its row says why)
                    rows.append({"conv": conv, "kernel": f"block {block}, {warps} warps", "error": repr(e)[:300]})
                    print(conv, block, warps, "error", repr(e)[:200], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
