"""Does a session rebuilt from its journal continue as the computed one on the GPU (issue 44,
item 3)? One device call, after `python3 benchmarks/install_wheels.py .whl $SITE` (carry [".whl"]: the
image lacks ftfy; $SITE is gpu_serve.sh's SITE, the folder the wheels go to):

    PYTHONPATH=$SITE:$PWD python3 -m benchmarks.probes.replay_check --out $OUT/replay_check.json

For each variant (bf16 with cuDNN attention; FP8 GEMMs + the FP8 self-attention over its code
cache; each eager, and compiled with --compile), a DiT of the released dims with `--layers`
blocks (seeded random weights, the served window of 15 latent frames with a sink of 3) runs
one open-ended 464x832 session the way a replica does (`step(defer_update=True)`, its cache
update run after the latents are out), keeping each chunk as the journal does (poses,
intrinsics, y, clean latents; the noise generator's state after the last). A second session
is then rebuilt from that journal (`DiTEngine.replay`, as `restore` does, one chunk per call),
and both make the next `--next` chunks from the same inputs. Reported per variant: whether the
rebuilt session's latents are bitwise those of the computed one, the max abs difference, and
which of the caches' tensors differ after the rebuild (bitwise), so that a divergence is
located: the self-attention K/V (codes, scales), the cross-attention caches, the text.

Exits 1 (with the JSON) when a variant's rebuilt chunks differ. On the CPU (float32, the tiny
preset: `--preset tiny --device cpu --dtype float32`) it checks the probe itself.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from model.accel import AccelOptions, optimize_dit
from model.accel.fp8_attention import append_codes
from model.config import preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.session import DiTSessionSpec, PastChunk
from model.warmup import warm_camera

SEED = 20261206


def _tensors(obj, prefix: str, out: dict[str, torch.Tensor], depth: int = 0) -> None:
    """Every tensor reachable from `obj` (dataclass fields, attributes, lists), by path."""
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(v, f"{prefix}[{i}]", out, depth + 1)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {})) + [s for s in getattr(obj, "__slots__", ()) if isinstance(s, str)]
        for name in names:
            try:
                v = getattr(obj, name)
            except AttributeError:
                continue
            if isinstance(v, (torch.Tensor, list, tuple)) or type(v).__module__.startswith("model."):
                _tensors(v, f"{prefix}.{name}", out, depth + 1)


def cache_differences(a, b) -> list[str]:
    """Paths of the caches' (and text's) tensors that differ bitwise between two sessions."""
    ta, tb = {}, {}
    _tensors(a.caches, "caches", ta)
    _tensors(b.caches, "caches", tb)
    _tensors(a.text, "text", ta)
    _tensors(b.text, "text", tb)
    diff = []
    for path, x in ta.items():
        y = tb.get(path)
        if y is None or x.shape != y.shape or x.dtype != y.dtype:
            diff.append(f"{path} (shape/dtype)")
        elif not torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, y.view(torch.uint8)
                             if y.dtype.itemsize == 1 else y):
            diff.append(path)
    return diff


def inputs(k: int, height: int, width: int, gen: torch.Generator) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    y = torch.randn(20, 3, height // 8, width // 8, generator=gen)
    poses, intrinsics = warm_camera(k, height, width)
    poses[:, 0, 3] += 0.02 * np.arange(len(poses))
    return y, poses, intrinsics


def check(engine: DiTEngine, size: tuple[int, int], chunks: int, following: int) -> dict:
    height, width = size
    gen = torch.Generator().manual_seed(SEED)
    context = torch.randn(64, engine.cfg.text_dim, generator=gen)
    spec = DiTSessionSpec(context=context, height=height, width=width, seed=SEED)
    feed = [inputs(k, height, width, gen) for k in range(chunks + following)]
    live = engine.open(spec)
    journal = []
    for k in range(chunks):
        y, poses, intrinsics = feed[k]
        out = engine.step(live, y.clone(), poses, intrinsics, defer_update=True)
        engine.finish_chunk(live)  # as the replica: right after the latents are out
        journal.append(PastChunk(poses, intrinsics, y, out.latents.float().cpu(), None, out.kv_growth))
    noise = live.noise.state()
    rebuilt = engine.open(spec)
    for chunk in journal:  # one chunk per call, as `restore` replays them
        engine.replay(rebuilt, spec, [chunk], None)
    engine.replay(rebuilt, spec, [], noise)
    differ = cache_differences(live, rebuilt)
    result = {"caches_differ": differ[:40], "caches_differing": len(differ), "next": []}
    for k in range(chunks, chunks + following):
        y, poses, intrinsics = feed[k]
        a = engine.step(live, y.clone(), poses, intrinsics, defer_update=True)
        engine.finish_chunk(live)
        b = engine.step(rebuilt, y.clone(), poses, intrinsics, defer_update=True)
        engine.finish_chunk(rebuilt)
        result["next"].append({"chunk": k, "identical": bool(torch.equal(a.latents, b.latents)),
                               "max_abs": float((a.latents.float() - b.latents.float()).abs().max())})
    result["identical"] = all(n["identical"] for n in result["next"])
    engine.close(live)
    engine.close(rebuilt)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--chunks", type=int, default=6, help="chunks computed before the rebuild (the window rolls after 5)")
    p.add_argument("--next", type=int, default=2, help="chunks both make after it")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--size", default="464*832")
    p.add_argument("--compile", action="store_true", help="also the compiled variants (the served configs')")
    p.add_argument("--variants", nargs="+", default=["bf16", "fp8"])
    p.add_argument("--out", default="replay_check.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    size = tuple(int(s) for s in args.size.split("*"))
    cfg = preset(args.preset).dit
    if args.preset == "lingbot-world-fast":
        cfg = dataclasses.replace(cfg.with_window(15, 3), num_layers=args.layers)
    dtype = getattr(torch, args.dtype)
    out: dict = {"preset": args.preset, "layers": cfg.num_layers, "size": list(size), "chunks": args.chunks,
                 "device": str(device), "variants": {}}
    # bf16 before FP8: FP8 GEMMs release the bf16 weights
    for name in args.variants:
        for compile in ((False, True) if args.compile else (False,)):
            fp8 = name == "fp8"
            dit = init_dit_random(cfg, dtype, device, SEED, residual_scaled=True)
            if device.type == "cuda":
                options = AccelOptions.for_serving(device, compile=compile, fp8=fp8, fp8_attention=fp8)
                kv = KVCacheConfig.for_serving(device, fp8_attention=fp8)
                options.check_cache(kv)
                engine = DiTEngine(optimize_dit(dit, options), skip_final_update=options.skip_final_update, kv=kv,
                                   append_codes=append_codes)
            else:
                engine = DiTEngine(dit, kv=KVCacheConfig())
            key = f"{name}{'_compiled' if compile else ''}"
            out["variants"][key] = check(engine, size, args.chunks, args.next)
            print(json.dumps({key: out["variants"][key]})[:2000], flush=True)
            del engine, dit
            if device.type == "cuda":
                torch.cuda.empty_cache()
    out["ok"] = all(v["identical"] for v in out["variants"].values())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
