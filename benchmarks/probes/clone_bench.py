"""A fork at the head, engine level (issue 33): `DiTEngine.clone` / `VaeEngine.clone` of a
--chunks-chunk session against the journal rebuild they replace (`DiTEngine.restore`: one
cache-update call per chunk; the VAE's conditions and decodes), on one device, random
full-size weights (the same work as real ones).

    python -m benchmarks.probes.clone_bench --chunks 20 --out clone.json

The engine runs a replica's options (`AccelOptions.for_serving`: on CUDA the fast block,
cuDNN attention, the ring window; `--fp8` / `--fp8-attention` the opt-in FP8 paths; not
compiled). Reports the mean DiT step, the clone's seconds (device copies, synchronised) and the
rebuild's, and the next chunk's latents from the clone (a fork at the head, and a snapshot: the
same copy) and from the rebuild against the source's from the same inputs: equal, and their
largest and relative differences (issue 33: on a GPU bf16 kernels need not repeat bit for bit;
a replay recomputes every cache update). The VAE's part times its clone beside one condition +
decode (the replay's unit: an fMP4 session's fork still replays its decodes, see
deployments/replicas/vae.py `clone`).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import numpy as np
import torch

from benchmarks.probes import cli
from model.accel import AccelOptions
from model.dit.caches import KVCacheConfig
from model.factory import load_dit_engine, load_vae_engine
from model.session import DiTSessionSpec, PastChunk

INTRINSICS = [[500.0, 500.0, 416.0, 240.0]]  # fx, fy, cx, cy at the default 480x832


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _chunk(k: int, lat: tuple[int, int], gen: torch.Generator) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Chunk k of a dolly: y [20, 3, lh, lw], poses [N, 4, 4], intrinsics [N, 4]."""
    n = 9 if k == 0 else 12
    poses = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
    poses[:, 2, 3] = 0.05 * (np.arange(n) + (0 if k == 0 else 9 + 12 * (k - 1)))
    return torch.randn(20, 3, *lat, generator=gen), poses, np.repeat(np.float32(INTRINSICS), n, 0)


def _timed(device: str, fn):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float32."""
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def run(args: argparse.Namespace) -> dict:
    device, (h, w) = args.device, args.size
    kv = KVCacheConfig.for_serving(device, fp8_attention=args.fp8_attention)
    options = AccelOptions.for_serving(device, fp8=args.fp8, fp8_attention=args.fp8_attention)
    dit = load_dit_engine(args.preset, None, args.dtype, device, local_attn_size=args.window,
                          sink_size=args.sink, random_weights=True, kv=kv, options=options)
    gen = torch.Generator().manual_seed(0)
    spec = DiTSessionSpec(context=torch.randn(64, dit.cfg.text_dim, generator=gen), height=h, width=w)
    lat = (h // 8, w // 8)
    a = dit.open(spec)
    past, steps = [], []
    for k in range(args.chunks):
        y, poses, intr = _chunk(k, lat, gen)
        out, s = _timed(device, lambda: dit.step(a, y, poses, intr, defer_update=True))
        dit.finish_chunk(a)
        steps.append(s)
        past.append(PastChunk(poses, intr, y, out.latents))
    noise = a.noise.state()
    clones = []
    for _ in range(args.repeats):
        b, s = _timed(device, lambda: dit.clone(a))
        clones.append(s)
        dit.close(b)
        del b
    b, _ = _timed(device, lambda: dit.clone(a))
    y, poses, intr = _chunk(args.chunks, lat, gen)
    next_b = dit.step(b, y.clone(), poses, intr).latents
    dit.close(b)  # one session beside the source at a time (a full-size window is GiBs)
    del b
    restored, restore_s = _timed(device, lambda: dit.restore(spec, past, noise))
    next_r = dit.step(restored, y.clone(), poses, intr).latents
    dit.close(restored)
    del restored
    next_a = dit.step(a, y.clone(), poses, intr).latents
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "size": [h, w], "chunks": args.chunks, "window": args.window, "kv": kv.format, "ring": kv.ring,
        "dit_step_mean_s": float(np.mean(steps[1:])) if len(steps) > 1 else steps[0],
        "dit_session_bytes": a.caches.nbytes,
        "dit_clone_s": clones, "dit_restore_s": restore_s,
        "fp8": args.fp8, "fp8_attention": args.fp8_attention,
        "clone_next_equal": bool(torch.equal(next_a, next_b)),
        "clone_next_max_abs_diff": float((next_a - next_b).abs().max()),
        "clone_next_rel_err": _rel(next_b, next_a),
        "restore_next_equal": bool(torch.equal(next_a, next_r)),
        "restore_next_max_abs_diff": float((next_a - next_r).abs().max()),
        "restore_next_rel_err": _rel(next_r, next_a),
    }
    dit.close(a)
    del a, dit
    if device == "cuda":
        torch.cuda.empty_cache()

    vae = load_vae_engine(args.preset, None, args.dtype, device, random_weights=True)
    image = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    v = vae.open(image, h, w)
    units = []
    for k in range(min(args.chunks, args.vae_chunks)):
        latents = torch.randn(16, 3, *lat, generator=gen)
        _, s = _timed(device, lambda: (vae.condition(v), vae.decode_float(v, latents)))
        units.append(s)
    vae_clones = []
    for _ in range(args.repeats):
        c, s = _timed(device, lambda: vae.clone(v))
        vae_clones.append(s)
    result |= {"vae_condition_decode_mean_s": float(np.mean(units[1:])) if len(units) > 1 else units[0],
               "vae_session_bytes": v.nbytes, "vae_clone_s": vae_clones}
    return result


def main(argv: Optional[list[str]] = None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--vae-chunks", type=int, default=4, help="chunks the VAE part decodes before its clone")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    return cli.emit(run(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
