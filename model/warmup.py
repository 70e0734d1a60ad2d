"""Warm-up: run each engine once at every size it will serve, before it serves anyone.

The first calls at a size compile the DiT's and the VAE's regions (`torch.compile`, static
shapes: once per size), let cuDNN autotune its convolutions and attention plans, and build the
x264 encoder; on an H200 the first session after start took 7.0 s to its first chunk against
0.33 s for the second. A replica that warms up in its constructor takes no traffic before it
is done. Warm-up sessions are opened on the engines directly and closed at once: no session
table, cache or counter of the serving layer sees them.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from model.compile_cache import compile_seconds
from model.vae.fast import VAE_NORM_SHAPES
from camera.frames import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES, chunk_video_frames
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.session import DiTSessionSpec

Size = tuple[int, int]
DIT_CHUNKS = 2  # chunk 0 and a chunk attending to a filled cache: every compiled shape of a size
VAE_CHUNKS = 3  # chunk 0 (image + 8 zero frames, 9 decoded), then the steady 12-frame shapes twice
WARMUP_PROMPT = "A warm-up prompt: a quiet street at noon."
GRAY = 128
# Compiled shapes per size of one compiled function: the DiT regions see one or two shapes per
# size (FP8: the activation quantizer sees K = dim and K = ffn_dim), the VAE norm up to
# VAE_NORM_SHAPES.
SHAPES_PER_SIZE = VAE_NORM_SHAPES


@dataclass
class WarmupReport:
    """What one replica warmed up, and how long it took: in all, and per size (`size_seconds`,
    in `sizes`' order; of each, `compile_seconds` were torch.compile's own, model/compile_cache.py)."""

    sizes: list[Size] = field(default_factory=list)
    seconds: float = 0.0
    size_seconds: list[float] = field(default_factory=list)
    compile_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"warmed_sizes": [list(s) for s in self.sizes], "warmup_s": round(self.seconds, 3)}

    def per_size(self) -> list[dict[str, Any]]:
        """One entry per warmed size: its seconds and the compilation's share of them."""
        return [{"size": list(s), "seconds": round(sec, 3), "compile_s": round(comp, 3)}
                for s, sec, comp in zip(self.sizes, self.size_seconds, self.compile_seconds)]


def allow_recompiles(sizes: int) -> None:
    """Raise torch._dynamo's recompile limits so that every compiled function keeps a compiled
    graph for each of `sizes` output sizes (beyond the limit dynamo falls back to eager:
    correct, but slow for that size)."""
    config = torch._dynamo.config
    per_function = SHAPES_PER_SIZE * max(1, sizes)
    config.recompile_limit = max(config.recompile_limit, per_function)
    if hasattr(config, "accumulated_recompile_limit"):  # torch >= 2.6
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 8 * per_function)


def _timed(fn: Callable[[], None], sizes: Iterable[Size]) -> WarmupReport:
    t0 = time.perf_counter()
    fn()
    return WarmupReport(list(sizes), time.perf_counter() - t0)


def _per_size(run_one: Callable[[Size], None], sizes: Sequence[Size]) -> WarmupReport:
    """`run_one` at each size in turn, each timed (wall clock and torch.compile's share)."""
    report = WarmupReport(list(sizes))
    t0 = time.perf_counter()
    for size in sizes:
        s0, c0 = time.perf_counter(), compile_seconds()
        run_one(size)
        report.size_seconds.append(time.perf_counter() - s0)
        report.compile_seconds.append(compile_seconds() - c0)
    report.seconds = time.perf_counter() - t0
    return report


def warm_camera(k: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk k's poses [N, 4, 4] and intrinsics [N, 4] as a served session sends them: 9 poses
    for chunk 0, 12 after, a slow dolly. The camera's whole path runs (the interpolation to
    latent-frame poses: a still single pose skips it, and its first run imports scipy's
    interpolation, 0.3 s that the first session after a start paid in its first chunk)."""
    n = chunk_video_frames(k)
    start = 0 if k == 0 else FIRST_CHUNK_VIDEO_FRAMES + CHUNK_VIDEO_FRAMES * (k - 1)
    poses = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
    poses[:, 2, 3] = 0.01 * (start + np.arange(n))
    return poses, np.tile(np.array([[w / 2, w / 2, w / 2, h / 2]], dtype=np.float32), (n, 1))


def warm_up_dit(engine: DiTEngine, sizes: Sequence[Size], chunks: int = DIT_CHUNKS) -> WarmupReport:
    """A session of `chunks` chunks at each size (zero conditioning, a served session's camera:
    `warm_camera`), closed after."""

    def run(size: Size) -> None:
        h, w = size
        spec = DiTSessionSpec(context=torch.zeros(8, engine.cfg.text_dim), height=h, width=w, seed=0)
        session = engine.open(spec)
        try:
            y = torch.zeros(20, CHUNK_LATENT_FRAMES, h // 8, w // 8)
            for k in range(chunks):
                engine.step(session, y, *warm_camera(k, h, w))
        finally:
            engine.close(session)

    return _per_size(run, sizes)


def warm_up_vae(engine: VaeEngine, sizes: Sequence[Size], chunks: int = VAE_CHUNKS,
                consumer: Optional[Callable[[Size], Callable[[np.ndarray], object]]] = None) -> WarmupReport:
    """Condition and decode `chunks` chunks at each size from a gray image; `consumer(size)`
    gives what takes each chunk's uint8 frames (e.g. a fresh fMP4 muxer's `add_chunk`)."""

    def run(size: Size) -> None:
        h, w = size
        session = engine.open(np.full((h, w, 3), GRAY, dtype=np.uint8), h, w)
        take = consumer((h, w)) if consumer is not None else None
        try:
            for _ in range(chunks):
                engine.condition(session)
                frames = engine.decode(session, torch.zeros(16, CHUNK_LATENT_FRAMES, h // 8, w // 8))
                if take is not None:
                    take(frames)
        finally:
            engine.close(session)

    return _per_size(run, sizes)


def warm_up_text(engine: TextEngine) -> WarmupReport:
    """One prompt through the encoder (device kernels, tokenizer)."""
    return _timed(lambda: engine.encode(WARMUP_PROMPT), [])
