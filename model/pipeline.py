"""WorldPipeline: the three engines in one process — open a session, step chunks, decode.

There is one code path. The offline call (`generate`) is a session whose trajectory is known
up front: it declares the planned length (the reference's whole-video noise plan) and the
whole-trajectory translation scale, then feeds the chunks exactly as a streaming client
would: the slices poses[12k:12k+12] when the reference samples the trajectory at integer
frames (frame counts 12k - 3, e.g. 81), else the 3 latent-frame poses per chunk that the
reference interpolates over the whole trajectory (spec H.3).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from camera import (CHUNK_LATENT_FRAMES, DEFAULT_INTRINSICS_RESOLUTION, DEFAULT_SIZE, chunk_cameras, frame_plan,
                    offline_latent_poses, output_size, parse_size, planned_latent_frames, translation_scale)
from model.engine_api import ChunkOutput
from model.engines import DiTEngine, TextEngine, VaeEngine, to_uint8
from model.session import DiTSession, DiTSessionSpec, VaeSession

DEFAULT_MAX_AREA = parse_size(DEFAULT_SIZE)


@dataclass(frozen=True)
class SessionRequest:
    """What a client opens a session with, in process (PROTOCOL.md: a first infer and its
    options). The server's counterpart, once the output size is chosen, is
    `deployments.wire.SessionOptions`; both derive the model's `DiTSessionSpec`."""

    image: np.ndarray  # RGB uint8 [H0, W0, 3]
    prompt: str
    seed: int = 42
    max_area: int = DEFAULT_MAX_AREA
    num_frames: int | None = None  # planned total video frames (4n + 1)
    translation_scale: float | None = None
    intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION


@dataclass(eq=False)
class Session:
    spec: SessionRequest
    height: int
    width: int
    dit: DiTSession
    vae: VaeSession
    timings: dict[str, float] = field(default_factory=dict)  # session-start stages


@dataclass
class GenerateResult:
    latents: torch.Tensor  # float32 [16, lat_f, lh, lw]
    frames: np.ndarray  # uint8 [F, h, w, 3]
    chunk_timings: list[dict[str, float]]


class WorldPipeline:
    def __init__(self, text: TextEngine, vae: VaeEngine, dit: DiTEngine) -> None:
        self.text, self.vae, self.dit = text, vae, dit

    @classmethod
    def load(cls, preset: str = "tiny", checkpoint: str | None = None,
             dtype: torch.dtype = torch.float32, device: str = "cpu",
             local_attn_size: int | None = None, sink_size: int | None = None,
             shift: float = 10.0) -> "WorldPipeline":
        """From a checkpoint in the released layout, or the embedded tiny model when
        `checkpoint` is None (see model/factory.py)."""
        from model.factory import load_dit_engine, load_text_engine, load_vae_engine

        return cls(
            load_text_engine(preset, checkpoint, dtype, device),
            load_vae_engine(preset, checkpoint, dtype, device),
            load_dit_engine(preset, checkpoint, dtype, device, local_attn_size, sink_size, shift),
        )

    def open_session(self, spec: SessionRequest, trace: bool = False) -> Session:
        t0 = time.perf_counter()
        h, w = output_size(spec.max_area, spec.image.shape[0], spec.image.shape[1])
        context = self.text.encode(spec.prompt)
        t1 = time.perf_counter()
        dit_session = self.dit.open(DiTSessionSpec(
            context=context, height=h, width=w, seed=spec.seed,
            total_latent_frames=planned_latent_frames(spec.num_frames),
            translation_scale=spec.translation_scale,
            intrinsics_resolution=spec.intrinsics_resolution,
        ))
        dit_session.trace = [] if trace else None
        session = Session(spec, h, w, dit_session, self.vae.open(spec.image, h, w))
        session.timings["text_encode"] = t1 - t0
        return session

    def update_prompt(self, session: Session, prompt: str) -> None:
        """Prompt steering: the next chunks attend to `prompt` (encoded now); the scene (KV
        cache, image conditioning, position, noise stream) is kept (`DiTEngine.update_prompt`)."""
        self.dit.update_prompt(session.dit, self.text.encode(prompt))

    def step(self, session: Session, poses: np.ndarray, intrinsics: np.ndarray) -> ChunkOutput:
        """Next chunk from its N camera poses [N, 4, 4] and intrinsics [N, 4]."""
        y, t_enc = self._condition(session)
        out = self.dit.step(session.dit, y, poses, intrinsics)
        out.timings["vae_encode"] = t_enc
        return out

    def step_latent_poses(self, session: Session, latent_poses: np.ndarray, k: np.ndarray) -> ChunkOutput:
        """Next chunk from its 3 latent-frame poses and one intrinsics row."""
        y, t_enc = self._condition(session)
        out = self.dit.step_latent_poses(session.dit, y, latent_poses, k)
        out.timings["vae_encode"] = t_enc
        return out

    def _condition(self, session: Session) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        y = self.vae.condition(session.vae)
        if session.dit.trace is not None:
            session.dit.trace.append({"kind": "y", "y": y})
        return y, time.perf_counter() - t0

    def decode(self, session: Session, latents: torch.Tensor) -> np.ndarray:
        """Chunk latents -> uint8 frames [9 or 12, h, w, 3]."""
        video = self.vae.decode_float(session.vae, latents)
        if session.dit.trace is not None:
            session.dit.trace.append({"kind": "video", "video": video.cpu()})
        return to_uint8(video)

    def close(self, session: Session) -> None:
        self.dit.close(session.dit)
        self.vae.close(session.vae)

    def generate(self, image: np.ndarray, prompt: str, poses: np.ndarray, intrinsics: np.ndarray,
                 frame_num: int = 81, seed: int = 42, max_area: int = DEFAULT_MAX_AREA,
                 intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION,
                 trace: bool = False, prompt_schedule: dict[int, str] | None = None
                 ) -> tuple[GenerateResult, Session]:
        """The offline run of a whole trajectory (the reference's `generate`).

        `prompt_schedule` {chunk: prompt}: prompt steering, the prompt is updated before that
        chunk (chunk >= 1), as a streaming client's `prompt_update` on that chunk's infer."""
        schedule = dict(prompt_schedule or {})
        if any(c < 1 for c in schedule):
            raise ValueError("prompt_schedule steers chunks >= 1; chunk 0 uses `prompt`")
        poses = np.asarray(poses)
        intrinsics = np.asarray(intrinsics)
        kept, lat_f, video_frames = frame_plan(frame_num, poses.shape[0])
        spec = SessionRequest(image, prompt, seed, max_area, num_frames=video_frames,
                           translation_scale=translation_scale(poses, frame_num),
                           intrinsics_resolution=intrinsics_resolution)
        session = self.open_session(spec, trace=trace)
        integer_positions = kept == video_frames
        latent_poses = None if integer_positions else offline_latent_poses(poses, frame_num)
        latents, frames, timings = [], [], []
        for c in range(lat_f // CHUNK_LATENT_FRAMES):
            if c in schedule:
                self.update_prompt(session, schedule[c])
            if integer_positions:
                # the reference uses the trajectory's first intrinsics row for every frame
                chunk_poses, _ = chunk_cameras(poses[:kept], intrinsics[:kept], c)
                out = self.step(session, chunk_poses, intrinsics[:1])
            else:
                lo = c * CHUNK_LATENT_FRAMES
                out = self.step_latent_poses(session, latent_poses[lo:lo + CHUNK_LATENT_FRAMES], intrinsics[0])
            t0 = time.perf_counter()
            frames.append(self.decode(session, out.latents))
            out.timings["vae_decode"] = time.perf_counter() - t0
            latents.append(out.latents)
            timings.append(out.timings)
        result = GenerateResult(torch.cat(latents, dim=1), np.concatenate(frames), timings)
        return result, session
