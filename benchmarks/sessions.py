"""Sessions through the engines: DiT-only runs (timing, numerics) and the end-to-end chunk loop
(camera -> latents -> decoded frames -> fMP4 bytes)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from benchmarks.build import Inputs
from benchmarks.measure import PeakMemory, camera_feature_bytes, module_bytes, sync, timed
from camera.frames import FPS
from media.fmp4 import Fmp4Muxer
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.session import DiTSessionSpec

CONTEXT_SEED = 11
Y_SEED = 12


@dataclass
class DiTRun:
    chunk_s: list[float]
    latents: list[torch.Tensor]  # CPU float32 [16, 3, lh, lw] per chunk
    memory: dict[str, float] = field(default_factory=dict)  # GiB
    first_velocity: torch.Tensor | None = None  # the session's first DiT output (when traced)

    @property
    def total_s(self) -> float:
        return sum(self.chunk_s)


def run_dit(engine: DiTEngine, inputs: Inputs, chunks: int, seed: int = 42, trace_first: bool = False) -> DiTRun:
    """One DiT session of `chunks` chunks (planned length = chunks), fixed stand-in context
    and y, the benchmark trajectory; per-chunk wall times and the memory split.

    `trace_first` keeps the first DiT call's output (the same inputs in every variant)."""
    device = engine.device
    spec = DiTSessionSpec(
        context=inputs.context(engine.cfg.text_dim, CONTEXT_SEED), height=inputs.height,
        width=inputs.width, seed=seed, total_latent_frames=3 * chunks,
        translation_scale=inputs.translation_scale,
    )
    times, latents = [], []
    first = None
    with PeakMemory(device) as mem:
        session = engine.open(spec)
        session.trace = [] if trace_first else None
        for k in range(chunks):
            y = inputs.y(k, spec.lat_h, spec.lat_w, Y_SEED)
            poses, intrinsics = inputs.chunk_cameras(k)
            out, dt = timed(lambda: engine.step(session, y, poses, intrinsics), device)
            times.append(dt)
            latents.append(out.latents)
            if k == 0 and trace_first:  # after the first chunk (a session of one chunk has it too)
                first = next(e["out"] for e in session.trace if e["kind"] == "dit")
                session.trace = None
        kv_bytes = session.caches.nbytes
        engine.close(session)
    run = DiTRun(times, latents, first_velocity=first)
    if device.type == "cuda":
        gib = 1024**3
        weights = module_bytes(engine.dit)
        other = mem.start - weights  # resident memory that is not this DiT's (other models)
        cam = camera_feature_bytes(engine.cfg, 3 * spec.frame_seqlen, engine.dtype)
        peak = mem.peak - other
        run.memory = {"peak": peak / gib, "weights": weights / gib, "kv_and_cross_cache": kv_bytes / gib,
                      "camera_features": cam / gib, "activations": (peak - weights - kv_bytes - cam) / gib,
                      "process_peak": mem.peak / gib}
    del session
    return run


@dataclass
class EndToEnd:
    """Per-chunk stage times of one session (seconds) and the time to its first fMP4 bytes."""

    stages: list[dict[str, float]]
    session_open: dict[str, float]
    first_chunk_s: float
    payload_bytes: list[int]

    def chunk_totals(self) -> list[float]:
        return [s["total"] for s in self.stages]


def run_end_to_end(text: TextEngine, vae: VaeEngine, dit: DiTEngine, inputs: Inputs, seed: int = 42) -> EndToEnd:
    """A new session through the three engines and the muxer, as the serving graph runs it:
    T5 encode, VAE/DiT session open, then per chunk conditioning encode -> DiT -> decode ->
    uint8 -> fMP4 fragment."""
    device = dit.device
    sync(device)
    t_start = time.perf_counter()
    context, t_text = timed(lambda: text.encode(inputs.prompt), device)
    spec = DiTSessionSpec(context=context, height=inputs.height, width=inputs.width, seed=seed,
                          total_latent_frames=inputs.latent_frames, translation_scale=inputs.translation_scale)
    (vs, ds), t_open = timed(lambda: (vae.open(inputs.image, inputs.height, inputs.width), dit.open(spec)), device)
    mux = Fmp4Muxer(inputs.width, inputs.height, FPS)
    stages, sizes, first = [], [], 0.0
    for k in range(inputs.chunks):
        poses, intrinsics = inputs.chunk_cameras(k)
        y, t_enc = timed(lambda: vae.condition(vs), device)
        out, t_dit = timed(lambda: dit.step(ds, y, poses, intrinsics), device)
        frames, t_dec = timed(lambda: vae.decode(vs, out.latents), device)
        payload, t_mux = timed(lambda: mux.add_chunk(frames), device)
        sizes.append(len(payload))
        stages.append({"vae_encode": t_enc, "dit": t_dit, "vae_decode": t_dec, "mux": t_mux,
                       "total": t_enc + t_dit + t_dec + t_mux})
        if k == 0:
            first = time.perf_counter() - t_start
    dit.close(ds)
    vae.close(vs)
    return EndToEnd(stages, {"text_encode": t_text, "open": t_open}, first, sizes)
