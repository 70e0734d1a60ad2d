"""Golden check: run our pipeline from a golden's raw inputs and compare every stage.

    python -m model.golden GOLDEN.pt --ckpt DIR --examples DIR

Runs in float32 on CPU from the example image, prompt, poses and intrinsics with the
golden's frame_num, max_area, shift, seed, local_attn_size and sink_size (format
`lwf-golden-v1`, ../shared/golden/README.md) and prints one row per stage with the max
absolute and max relative error (max|a - b| / max|b|). The last line is
`golden: PASS <name> max_rel=<x>` (exit 0) or `golden: FAIL ...` (exit 1).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.conditioning import load_image_rgb
from model.pipeline import WorldPipeline

TOLERANCE = 1e-4


@dataclass
class StageResult:
    stage: str
    max_abs: float
    max_rel: float
    exact_mismatch: bool = False  # for integer stages (ids, cache indices)

    @property
    def ok(self) -> bool:
        return not self.exact_mismatch and self.max_rel <= TOLERANCE


def compare(stage: str, ours, ref) -> StageResult:
    a = torch.as_tensor(ours).double()
    b = torch.as_tensor(ref).double()
    if a.shape != b.shape:
        return StageResult(f"{stage} shape {tuple(a.shape)} != {tuple(b.shape)}", float("inf"), float("inf"), True)
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    scale = b.abs().max().item() if b.numel() else 0.0
    return StageResult(stage, diff, diff / scale if scale else diff)


def compare_exact(stage: str, ours, ref) -> StageResult:
    equal = list(ours) == list(ref) if not torch.is_tensor(ours) else torch.equal(ours, torch.as_tensor(ref))
    return StageResult(stage, 0.0 if equal else float("inf"), 0.0 if equal else float("inf"), not equal)


def run_golden(golden: dict, ckpt: Path, examples: Path) -> list[StageResult]:
    meta = golden["meta"]
    example = examples / meta["example"]
    pipe = WorldPipeline.load(
        "tiny", str(ckpt), torch.float32, "cpu", meta["local_attn_size"], meta["sink_size"], meta["shift"]
    )
    image = load_image_rgb(example / "image.jpg")
    poses = np.load(example / "poses.npy")
    intrinsics = np.load(example / "intrinsics.npy")
    results: list[StageResult] = []

    ids, mask = pipe.text.encoder.tokenize(meta["prompt"])
    results.append(compare_exact("tokenizer ids", ids, golden["t5"]["ids"]))
    results.append(compare_exact("tokenizer mask", mask, golden["t5"]["mask"]))
    results.append(compare("t5 context", pipe.text.encode(meta["prompt"]), golden["t5"]["context"]))

    result, session = pipe.generate(
        image, meta["prompt"], poses, intrinsics, frame_num=meta["frame_num"], seed=meta["seed"],
        max_area=meta["max_area"], trace=True,
    )
    results.append(compare("image", session.vae.image, golden["image"]))
    trace = session.dit.trace
    ys = [e["y"] for e in trace if e["kind"] == "y"]
    chunks = [e for e in trace if e["kind"] == "chunk"]
    calls = [e for e in trace if e["kind"] == "dit"]
    results.append(compare("vae latent", torch.cat([y[4:] for y in ys], dim=1), golden["vae_encode"]["latent"]))
    for c, gchunk in enumerate(golden["chunks"]):
        if c >= len(chunks):
            results.append(StageResult(f"chunk {c} missing", float("inf"), float("inf"), True))
            continue
        results.append(compare(f"chunk {c} plucker", chunks[c]["plucker"], gchunk["plucker"]))
        results.append(compare(f"chunk {c} y", ys[c], gchunk["y"]))
        gcalls = [*gchunk["steps"], gchunk["cache_update"]]
        for s, gcall in enumerate(gcalls):
            name = f"chunk {c} step {s}" if s < len(gcalls) - 1 else f"chunk {c} cache update"
            ours = calls[c * len(gcalls) + s]
            results.append(compare(f"{name} x", ours["x"], gcall["x"]))
            results.append(compare(f"{name} out", ours["out"], gcall["out"]))
            results.append(compare_exact(
                f"{name} kv ends", [*ours["kv_after"], ours["current_start"]],
                [gcall["kv_global_end_after"][0], gcall["kv_local_end_after"][0], gcall["current_start"]],
            ))
    results.append(compare("latents", result.latents, golden["latents"]))
    results.append(compare("video", torch.cat([e["video"] for e in trace if e["kind"] == "video"], dim=1),
                           golden["video"]))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.golden", description=__doc__.split("\n")[0])
    parser.add_argument("golden", type=Path, help="golden .pt file (format lwf-golden-v1)")
    parser.add_argument("--ckpt", type=Path, required=True, help="checkpoint root (released layout)")
    parser.add_argument("--examples", type=Path, required=True, help="folder of the example inputs")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    golden = torch.load(args.golden, weights_only=True)
    if golden.get("format") != "lwf-golden-v1":
        print(f"golden: FAIL {args.golden.name} unknown format {golden.get('format')!r}")
        return 1
    try:
        results = run_golden(golden, args.ckpt, args.examples)
    except Exception as exc:  # the CLI's edge: report any failure as FAIL
        print(f"golden: FAIL {args.golden.stem} error: {type(exc).__name__}: {exc}")
        return 1
    width = max(len(r.stage) for r in results)
    print(f"{'stage':<{width}}  {'max_abs':>10}  {'max_rel':>10}  ok")
    for r in results:
        print(f"{r.stage:<{width}}  {r.max_abs:10.3e}  {r.max_rel:10.3e}  {'yes' if r.ok else 'NO'}")
    worst = max(r.max_rel for r in results)
    failed = [r.stage for r in results if not r.ok]
    if failed:
        print(f"golden: FAIL {args.golden.stem} max_rel={worst:.3e} failed={','.join(failed[:5])}")
        return 1
    print(f"golden: PASS {args.golden.stem} max_rel={worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
