"""The world store (issue 55): bytes per chunk, write latency, and the time to open a world.

    python -m benchmarks.worlds.store --backend local --root lwf-bench-worlds --out world_store.json
    python -m benchmarks.worlds.store --backend s3 --endpoint http://127.0.0.1:8333 --bucket worlds \\
        --out world_store_s3.json   # credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY

One world of `--chunks` chunks at `--size` (latent size = size / 8) is written chunk by chunk
through `Worlds.put_chunk` (what the write-behind writer calls), with the parts a served session
journals: poses [12, 4, 4] and intrinsics [12, 4] float32, y float32 [20, 3, lh, lw] (two
distinct, then repeated as the causal encoder's output converges: stored once), clean latents
float32 [16, 3, lh, lw], the CPU generator's state (5056 bytes) and `--video-kib` of fMP4
bytes (the video's size depends on the content: a stand-in, stated in the JSON). The arrays are
random (incompressible; nothing is compressed anyway). Per chunk: the bytes it adds and the
seconds of its write; then the seconds to open worlds of the `--open` chunk counts (load with
every part checked + the journal made back), each the best of `--repeats`. What a replay of the
inputs through the model costs instead is not measured here (it needs the model: GPU figures).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from deployments.config import AppArgs
from deployments.wire import NoiseSnapshot, PastChunk, SessionOptions
from deployments.worlds.backends import describe, open_worlds
from deployments.worlds.chunks import ChunkRecord
from deployments.worlds.journal_parts import journal_from_world
from deployments.worlds.worlds import Worlds
from deployments.worlds_args import WorldsArgs

NOISE_STATE_BYTES = 5056  # torch's CPU generator state


def records(chunks: int, h: int, w: int, video_bytes: int, seed: int = 0) -> list[ChunkRecord]:
    rng = np.random.default_rng(seed)
    lh, lw = h // 8, w // 8
    ys = [rng.standard_normal((20, 3, lh, lw), dtype=np.float32) for _ in range(2)]
    out = []
    for k in range(chunks):
        past = PastChunk(np.tile(np.eye(4, dtype=np.float32), (12, 1, 1)), np.ones((12, 4), np.float32),
                         ys[min(k, 1)], rng.standard_normal((16, 3, lh, lw), dtype=np.float32))
        noise = NoiseSnapshot(rng.integers(0, 256, NOISE_STATE_BYTES, dtype=np.uint8), False)
        out.append(ChunkRecord(k, past, noise, None, rng.bytes(video_bytes) if video_bytes else None))
    return out


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def write_world(worlds: Worlds, principal: str, recs: list[ChunkRecord], h: int, w: int) -> tuple[str, list, list]:
    options = SessionOptions("bench", "a prompt", "d", (h, w), 1, None, None, (480, 832))
    m = worlds.create(principal, "bench", AppArgs(), options, np.zeros((480, 832, 3), np.uint8),
                      np.zeros((40, 4096), np.float32))
    seconds, sizes, previous = [], [], None
    for r in recs:
        t0 = time.perf_counter()
        m2 = worlds.put_chunk(principal, m.world_id, r, previous)
        seconds.append(time.perf_counter() - t0)
        sizes.append(m2.bytes - m.bytes)
        m, previous = m2, r.past.y
    return m.world_id, seconds, sizes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("local", "s3"), default="local")
    p.add_argument("--root", default="lwf-data/bench-worlds")
    p.add_argument("--endpoint")
    p.add_argument("--bucket")
    p.add_argument("--prefix", default="bench")
    p.add_argument("--size", default="464*832")
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--open", default="10,50,100", help="chunk counts of the worlds opened")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--video-kib", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    h, w = (int(v) for v in a.size.split("*"))
    args = WorldsArgs(backend=a.backend, root=a.root, endpoint=a.endpoint, bucket=a.bucket, prefix=a.prefix)
    worlds = open_worlds(args)
    recs = records(a.chunks, h, w, a.video_kib * 1024)
    principal = f"bench-{time.time_ns()}"
    wid, seconds, sizes = write_world(worlds, principal, recs, h, w)
    result = {"backend": a.backend, "where": describe(args), "size": [h, w], "chunks": a.chunks,
              "video_bytes_per_chunk": a.video_kib * 1024,
              "bytes_per_chunk": {"first": sizes[0], "second": sizes[1] if len(sizes) > 1 else None,
                                  "median": statistics.median(sizes)},
              "write_s": {"p50": percentile(seconds, 0.5), "p95": percentile(seconds, 0.95), "max": max(seconds)},
              "open_s": {}}
    for n in (int(x) for x in a.open.split(",")):
        if n > a.chunks:
            continue
        open_id, _, _ = write_world(worlds, principal, recs[:n], h, w) if n < a.chunks else (wid, 0, 0)
        best = float("inf")
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            journal = journal_from_world(worlds.load(principal, open_id), None)
            best = min(best, time.perf_counter() - t0)
            assert journal.conditioned == n
        result["open_s"][str(n)] = best
    for m in worlds.list(principal):
        worlds.delete(principal, m.world_id)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
