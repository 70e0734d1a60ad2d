"""The VAE encoder's convs that cuDNN runs far from its rate, at a later chunk's shapes, on one GPU:

    python -m benchmarks.vae_conv_probe --out $OUT/vae_convs.json

As the encoder calls them for a later chunk of a 464x832 session with `vae_batch_frames` (12 new
frames, 2 cached ones), bf16, channels-last as the served VAE holds them:
* the first conv (3 -> 96, 3x3x3): cuDNN (the past concatenated, padding inside the conv, the bias
  added by PyTorch: `PaddedCausalConv3d`) against the Triton kernels of `model/vae/stem.py`
  (the padded buffer timed alone; the kernel over its launches; session 8's second run also had a
  first kernel that loaded each tap's weights per block of pixels: 1.48 ms against 0.61);
* the three spatial downsamplings (pad right / bottom by 1, 3x3 conv of stride 2, as
  `Downsample.resample`) against the 4x4 conv with padding 1 (`model/vae/downsample.py`).
Per row: milliseconds (the best of a few timed rounds) and the error against a float32 conv of
the same bf16 values (norm-relative).

Session 8's first run also timed the decoder's last conv (96 -> 3) as a Triton kernel: 11-12 ms
against cuDNN's 3.5 (`benchmarks/results/h200_round2_s8_rgb_convs.*`); removed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention_probe import bench, rel
from model.vae import stem as vae_stem
from model.vae.downsample import padded_conv

FRAMES, PAST, HEIGHT, WIDTH, WIDE = 12, 2, 464, 832, 96
DOWNSAMPLINGS = ((96, HEIGHT, WIDTH), (192, HEIGHT // 2, WIDTH // 2), (384, HEIGHT // 4, WIDTH // 4))
LAUNCHES = [(64, 4, 4), (64, 8, 2), (128, 4, 2), (128, 8, 2), (64, 4, 8)]  # (block, warps, programs per SM)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dev, bf16, cl = torch.device("cuda"), torch.bfloat16, torch.channels_last_3d
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []

    def row(conv: str, name: str, fn, want: torch.Tensor | None) -> None:
        try:
            got = fn()
            s = bench(fn)
        except Exception as e:  # noqa: BLE001 (a launch that does not fit: its row says why)
            rows.append({"conv": conv, "kernel": name, "error": repr(e)[:300]})
            print(f"{conv:8s} {name:40s} error {repr(e)[:200]}", flush=True)
            return
        err = None if want is None else rel(got, want)
        rows.append({"conv": conv, "kernel": name, "ms": s * 1e3, "err_vs_fp32": err})
        print(f"{conv:8s} {name:40s} {s * 1e3:7.3f} ms  err {err}", flush=True)

    # the first conv
    x = (torch.rand(1, 3, FRAMES, HEIGHT, WIDTH, device=dev, generator=gen) * 2 - 1).to(bf16)
    past = (torch.rand(1, 3, PAST, HEIGHT, WIDTH, device=dev, generator=gen) * 2 - 1).to(bf16)
    x, past = x.contiguous(memory_format=cl), past.contiguous(memory_format=cl)
    weight = (torch.randn(WIDE, 3, 3, 3, 3, device=dev, generator=gen) / 81 ** 0.5).to(bf16)
    bias = torch.randn(WIDE, device=dev, generator=gen) * 0.02
    want = F.conv3d(torch.cat([past, x], 2).float(), weight.float(), bias, padding=(0, 1, 1))
    weight_cl, bias16 = weight.contiguous(memory_format=cl), bias.to(bf16)
    row("stem", "cudnn (cat + conv + bias)",
        lambda: F.conv3d(torch.cat([past, x], 2), weight_cl, bias16, padding=(0, 1, 1)), want)
    buf = vae_stem.padded_input(x, past, 2, (1, 1))
    row("stem", "padded buffer alone", lambda: vae_stem.padded_input(x, past, 2, (1, 1)), None)
    packed = vae_stem.pack_stem_weight(weight)
    for block, warps, per_sm in LAUNCHES:
        row("stem", f"kernel, block {block}, {warps} warps, {per_sm}/SM",
            lambda b=block, w=warps, s=per_sm: vae_stem.stem_conv(buf, packed, bias, (3, 3, 3), WIDE, b, w, s), want)
    # the downsamplings
    for c, h, w in DOWNSAMPLINGS:
        frames = (torch.rand(FRAMES, c, h, w, device=dev, generator=gen) * 2 - 1).to(bf16)
        frames = frames.contiguous(memory_format=torch.channels_last)
        conv = torch.nn.Conv2d(c, c, 3, stride=2, device=dev)
        with torch.no_grad():
            conv.weight.normal_(0.0, (9 * c) ** -0.5, generator=gen)
        want = conv(F.pad(frames.float(), (0, 1, 0, 1)))
        conv = conv.to(bf16).to(memory_format=torch.channels_last).requires_grad_(False)
        four = padded_conv(conv).to(memory_format=torch.channels_last)
        row(f"down{c}", "pad + 3x3 stride 2 (the reference's)", lambda f=frames, m=conv: m(F.pad(f, (0, 1, 0, 1))), want)
        row(f"down{c}", "4x4 stride 2 padding 1", lambda f=frames, m=four: m(f), want)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
