"""The three engines a session runs through: text, VAE and DiT.

Each engine holds one model's weights and works on explicit session objects
(`model/session.py`), so each can live in its own process (a Ray Serve deployment) or all
three in one (`WorldPipeline`). What crosses a process boundary comes back on the CPU: the
text context, y, chunk latents (float32) and decoded frames (uint8 numpy). `decode_float`
is the exception: it returns the decoded video on the engine's device (callers convert it).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from camera.frames import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES
from model.dit.plucker import CameraTrack
from model.engine_api import ChunkOutput, ChunkPreempted, EngineCapabilities, SessionFootprint
from model.conditioning import image_condition_mask, make_y, preprocess_image
from model.config import DiTConfig
from model.dit.model import CausalDiT
from model.dit.caches import DiTCaches, KVCacheConfig, join_growth
from model.dit.kv_codes import AppendCodes, append_codes_reference
from model.dit.sampler import DENOISE_TIMESTEPS, FlowSchedule, NoisePlan, NoiseState, run_chunk, timestep_tensor
from model.session import DiTSession, DiTSessionSpec, PastChunk, VaeSession, frame_tokens
from model.t5 import TextEncoder
from model.vae.model import WanVAE


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """Decoded video [3, T, h, w] in [-1, 1] -> uint8 frames [T, h, w, 3] (the reference's
    trunc(((x + 1) / 2) * 255))."""
    frames = ((video.float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)  # truncates
    return frames.permute(1, 2, 3, 0).contiguous().cpu().numpy()


class TextEngine:
    """Prompt -> text-encoder context [L, text_dim] (once per session)."""

    def __init__(self, encoder: TextEncoder) -> None:
        self.encoder = encoder

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        return self.encoder.encode(prompt).float().cpu()


class VaeEngine:
    """Conditioning encode (y per chunk) and streaming decode, with per-session caches."""

    def __init__(self, vae: WanVAE) -> None:
        self.vae = vae

    @property
    def device(self) -> torch.device:
        return self.vae.device

    def open(self, image: np.ndarray, height: int, width: int) -> VaeSession:
        """A session for the RGB uint8 image [H0, W0, 3], generating height x width video."""
        return VaeSession(image=preprocess_image(image, height, width).to(self.device))

    @torch.inference_mode()
    def condition(self, session: VaeSession) -> torch.Tensor:
        """y of the session's next chunk -> float32 [20, 3, h/8, w/8].

        Chunk 0 encodes the image followed by 8 zero frames, every later chunk 12 zero
        frames, through the session's persistent encoder cache: the concatenation equals the
        reference's whole-video encode of [image, zeros] exactly.
        """
        session.check_open()
        first = session.encoded_chunks == 0
        h, w = session.height, session.width
        zeros = torch.zeros(3, FIRST_CHUNK_VIDEO_FRAMES - 1 if first else CHUNK_VIDEO_FRAMES, h, w,
                            device=self.device, dtype=session.image.dtype)
        video = torch.cat([session.image[:, None], zeros], dim=1) if first else zeros
        latent, session.enc_cache = self.vae.encode_chunk(video, session.enc_cache)
        session.encoded_chunks += 1
        mask = image_condition_mask(CHUNK_LATENT_FRAMES, first, latent.shape[2], latent.shape[3])
        return make_y(mask.to(latent.device), latent).cpu()

    @torch.inference_mode()
    def decode_float(self, session: VaeSession, latents: torch.Tensor) -> torch.Tensor:
        """Chunk latents [16, 3, lh, lw] -> video [3, 9 or 12, h, w] in [-1, 1], on the engine's
        device in the VAE's dtype (not copied to the CPU)."""
        session.check_open()
        video, session.dec_cache = self.vae.decode_chunk(latents.to(self.device), session.dec_cache)
        session.decoded_chunks += 1
        return video

    def decode(self, session: VaeSession, latents: torch.Tensor) -> np.ndarray:
        """Chunk latents -> uint8 frames [9 or 12, h, w, 3]."""
        return to_uint8(self.decode_float(session, latents))

    @torch.inference_mode()
    def clone(self, session: VaeSession) -> VaeSession:
        """An independent copy of a live session (a fork at its head): the image and both
        causal caches copied on the device, the chunk counters as they are."""
        session.check_open()
        return VaeSession(image=session.image.clone(), enc_cache=session.enc_cache.clone(),
                          dec_cache=session.dec_cache.clone(), encoded_chunks=session.encoded_chunks,
                          decoded_chunks=session.decoded_chunks)

    def close(self, session: VaeSession) -> None:
        session.close()


# Activations of one DiT call per token, calibrated on the H200 run 2 (0.77 GiB measured at 4524
# tokens, dim 5120, FFN 13824, bf16): about six float32 rows of `dim` (residual stream, norms,
# attention and cross-attention outputs) and two compute-dtype rows of `ffn_dim` (FFN hidden,
# GELU). The formula gives 0.75 GiB there.
ACTIVATION_F32_ROWS = 6
ACTIVATION_FFN_ROWS = 2
SAMPLER_TENSORS = 4  # float32 [16, 3, lh, lw] tensors a chunk's sampler holds (x, v, x0, a draw)


class DiTEngine:
    """The causal DiT with its 4-step sampler, over many sessions' explicit state
    (`DiTEngineProtocol`, model/engine_api.py, with every capability)."""

    capabilities = EngineCapabilities()
    kv: KVCacheConfig = KVCacheConfig()
    max_attention_size: int | None = None
    dit: CausalDiT
    cfg: DiTConfig

    def __init__(
        self,
        dit: CausalDiT,
        shift: float = 10.0,
        timesteps: tuple[int, ...] = DENOISE_TIMESTEPS,
        max_attention_size: int | None = None,
        skip_final_update: bool = False,
        kv: KVCacheConfig = KVCacheConfig(),
        append_codes: AppendCodes = append_codes_reference,
    ) -> None:
        """`skip_final_update`: leave out the t = 0 cache-update call of a session's last
        planned chunk (with `total_latent_frames` known, no later chunk can read its K/V).
        `kv`: how sessions' self-attention caches store K/V (`KVCacheConfig`; the default is
        the exact, shifting cache). `append_codes`: the writer of a "fp8_codes" cache (a device
        kernel injected by model/factory.py; the reference by default)."""
        self.dit = dit
        self.cfg = dit.cfg
        self.schedule = FlowSchedule(shift)
        self.timesteps = timesteps
        self.max_attention_size = max_attention_size
        self.skip_final_update = skip_final_update
        self.kv = kv
        self.append_codes = append_codes

    @property
    def device(self) -> torch.device:
        return next(self.dit.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.dit.dtype

    def session_cfg(self, full_attention: bool) -> DiTConfig:
        """The config a session's caches follow: the engine's, without its window for a
        full-attention session (the window lives in the caches only, never in the weights)."""
        return self.cfg.with_window(-1, 0) if full_attention else self.cfg

    def kv_frames(self, total_latent_frames: int | None, full_attention: bool = False) -> int:
        """Latent frames a session's self-attention cache holds (for admission control)."""
        cfg = self.session_cfg(full_attention)
        if cfg.local_attn_size != -1:
            return cfg.local_attn_size
        return total_latent_frames if total_latent_frames is not None else CHUNK_LATENT_FRAMES

    def session_bytes(self, spec_h: int, spec_w: int, kv_frames: int) -> int:
        """Bytes of a session's KV and cross-attention caches holding `kv_frames` latent frames."""
        return DiTCaches.kv_bytes(self.cfg, frame_tokens(spec_h, spec_w), kv_frames, self.dtype, self.kv.format)

    def token_share(self, tokens: int) -> int:
        """Tokens of a chunk this engine's device computes (all of them; sharded engines: its part)."""
        return tokens

    def footprint(self, height: int, width: int, kv_frames: int,
                  total_latent_frames: int | None) -> SessionFootprint:
        """Everything a session of this size holds on the device (see SessionFootprint)."""
        cfg = self.cfg
        lat_h, lat_w = height // 8, width // 8
        latent_cells = cfg.out_dim * lat_h * lat_w  # per latent frame, float32
        noise = 4 * latent_cells * total_latent_frames if total_latent_frames is not None else 0
        text = 4 * cfg.text_len * cfg.dim
        held = self.session_bytes(height, width, kv_frames) + noise + text
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        tokens = self.token_share(CHUNK_LATENT_FRAMES * lat_h * lat_w // 4)
        camera = cfg.num_layers * 2 * tokens * cfg.dim * itemsize
        activations = tokens * (ACTIVATION_F32_ROWS * cfg.dim * 4 + ACTIVATION_FFN_ROWS * cfg.ffn_dim * itemsize)
        sampler = SAMPLER_TENSORS * 4 * latent_cells * CHUNK_LATENT_FRAMES
        # FP8 KV: one layer's K/V read back in the compute dtype, the new chunk's float32
        # quantisation (the code cache reads nothing back: attention takes its codes)
        if self.kv.format == "fp8_scaled":
            visible = kv_frames * lat_h * lat_w // 4
            if self.max_attention_size is not None:
                visible = min(visible, self.max_attention_size)
            activations += 2 * self.token_share(visible) * cfg.dim * itemsize + 2 * tokens * cfg.dim * 4
        return SessionFootprint(held, camera + activations + sampler)

    def allocate_caches(self, spec: DiTSessionSpec) -> DiTCaches:
        """A new session's KV and cross-attention caches (sharded engines override this)."""
        return DiTCaches.allocate(
            self.session_cfg(spec.full_attention), spec.frame_seqlen, spec.total_latent_frames, self.dtype, self.device,
            max_attention_size=self.max_attention_size, kv=self.kv, append_codes=self.append_codes,
        )

    @torch.inference_mode()
    def open(self, spec: DiTSessionSpec) -> DiTSession:
        device = self.device
        return DiTSession(
            spec=spec,
            caches=self.allocate_caches(spec),
            text=self.dit.embed_text(spec.context.to(device)),
            camera=CameraTrack(spec.height, spec.width, spec.intrinsics_resolution,
                               spec.translation_scale, device=device),
            noise=NoisePlan(spec.seed, (self.cfg.out_dim, spec.lat_h, spec.lat_w),
                            spec.total_latent_frames, device=device),
        )

    @torch.inference_mode()
    def update_prompt(self, session: DiTSession, context: torch.Tensor) -> None:
        """Prompt steering: from the next chunk on the session attends to `context` [L, text_dim]
        (a new prompt's text-encoder output). Only the text embedding and the cross-attention
        caches change (recomputed by the next DiT call); the self-attention KV cache, the camera
        track, the noise stream and the chunk position are kept."""
        session.check_open()
        if context.ndim != 2 or context.shape[0] < 1:
            raise ValueError(f"context must be [L, text_dim], got {tuple(context.shape)}")
        self.finish_chunk(session)  # a deferred cache update belongs to the previous prompt
        session.text = self.dit.embed_text(context.to(device=self.device, dtype=torch.float32))
        for cache in session.caches.cross_attn:
            cache.reset()

    def step(self, session: DiTSession, y: torch.Tensor, poses: np.ndarray,
             intrinsics: np.ndarray, defer_update: bool = False,
             should_stop: Callable[[], bool] | None = None) -> ChunkOutput:
        """The session's next chunk from its y [20, 3, lh, lw] and N camera poses [N, 4, 4]
        with intrinsics [N, 4] (PROTOCOL.md `cameras`).

        `defer_update`: return the latents after the 4 denoising calls and leave the chunk's
        cache-update call (t = 0 on x0, which writes the K/V later chunks read) to
        `finish_chunk`: a server sends the chunk to decoding while the DiT writes its cache.
        Same calls in the same order, so the same numbers; the next step runs it first anyway.

        `should_stop()`, asked before each denoising call: True gives the chunk up
        (`ChunkPreempted`) with the session as before this step (camera track and noise
        position put back; its caches were only read), so the next `step` makes this chunk
        again, equal to one never given up."""
        session.check_open()
        self.finish_chunk(session)
        t0 = time.perf_counter()
        camera, noise = session.camera.clone(), session.noise.mark()  # (cheap: two 4x4 poses, a generator state)
        plucker = session.camera.chunk(poses, intrinsics)  # [1, 384, 3, lh, lw]
        try:
            return self._run(session, y, plucker, t0, defer_update, should_stop)
        except ChunkPreempted:
            session.camera = camera
            session.noise.rewind(noise)
            raise

    @torch.inference_mode()
    def finish_chunk(self, session: DiTSession) -> float:
        """Run the cache update a deferred step left (no-op without one); its seconds."""
        pending, session.pending_update = session.pending_update, None
        if pending is None:
            return 0.0
        t0 = time.perf_counter()
        pending()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def step_latent_poses(self, session: DiTSession, y: torch.Tensor, latent_poses: np.ndarray,
                          k: np.ndarray) -> ChunkOutput:
        """As `step`, from the chunk's 3 latent-frame poses and one intrinsics row (the
        offline path, whose poses are interpolated over the whole trajectory)."""
        session.check_open()
        self.finish_chunk(session)
        t0 = time.perf_counter()
        plucker = session.camera.chunk_from_latent_poses(latent_poses, k)
        return self._run(session, y, plucker, t0)

    @torch.inference_mode()
    def _run(self, session: DiTSession, y: torch.Tensor, plucker: torch.Tensor, t0: float,
             defer_update: bool = False, should_stop: Callable[[], bool] | None = None) -> ChunkOutput:
        device = self.device
        start = session.start_token
        session.caches.ensure_capacity(start + CHUNK_LATENT_FRAMES * session.spec.frame_seqlen)
        y = y.to(device=device, dtype=torch.float32)
        cam = self.dit.camera_features(plucker.to(device))
        x = session.noise.initial(session.chunk_index)
        trace = session.trace
        if trace is not None:
            trace.append({"kind": "chunk", "plucker": plucker.cpu(), "y": y.cpu()})

        planned = session.noise.total_latent_frames
        last_planned = planned is not None and (session.chunk_index + 1) * CHUNK_LATENT_FRAMES == planned

        def call(x_in: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            before = (session.caches.global_end, session.caches.local_end)
            out = self.dit(x_in, t, y, session.text, cam, session.caches, start)
            if trace is not None:
                trace.append({"kind": "dit", "x": x_in.cpu(), "t": t.cpu(), "out": out.cpu(),
                              "current_start": start, "kv_before": before,
                              "kv_after": (session.caches.global_end, session.caches.local_end)})
            return out

        def write_kv(x0: torch.Tensor) -> None:  # the cache update: t = 0 on the clean chunk
            t = timestep_tensor(0.0, x0.device)
            if trace is not None:  # a traced call records the whole call's output (the goldens')
                call(x0, t)
            else:
                self.dit.write_kv(x0, t, y, session.text, cam, session.caches, start)

        t1 = time.perf_counter()
        update = not (self.skip_final_update and last_planned)  # the last chunk's K/V are never read
        def denoise(x_in: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if should_stop is not None and should_stop():
                raise ChunkPreempted()
            return call(x_in, t)

        session.caches.record_growth()  # what a rebuild cannot redo: the denoising calls' writes (FP8 codes)
        try:
            x0 = run_chunk(denoise, x, self.schedule, session.noise, self.timesteps, update=False)
        except ChunkPreempted:  # its calls grew the descales all the same: the next chunk's record says so
            session.carried_growth = join_growth(session.carried_growth, session.caches.take_growth())
            raise
        except BaseException:
            session.caches.take_growth()  # recording stops
            raise
        growth = join_growth(session.carried_growth, session.caches.take_growth())
        session.carried_growth = None
        if update and not defer_update:
            write_kv(x0)
        latents = x0.float().cpu()  # synchronises
        t2 = time.perf_counter()
        session.chunk_index += 1
        if update and defer_update:
            session.pending_update = lambda: write_kv(x0)
        return ChunkOutput(latents, {"camera": t1 - t0, "dit": t2 - t1}, growth)

    @torch.inference_mode()
    def clone(self, session: DiTSession) -> DiTSession:
        """An independent copy of a live session (a fork at its head; `capabilities.clone`).

        A deferred cache update is run first, on the source (it would run before its next chunk
        anyway, with the same numbers), so the copy has none pending. Then every tensor the
        session writes in place is copied on the device: the self-attention caches (ring or
        shifting window, FP8 scales or codes and descales), the cross-attention caches, the
        text embedding, the noise plan's generator state and whole-video draw; the camera
        track's poses and the chunk position are copied. Both sessions then continue exactly
        as the source alone would have."""
        session.check_open()
        self.finish_chunk(session)
        return DiTSession(spec=session.spec, caches=session.caches.clone(), text=session.text.clone(),
                          camera=session.camera.clone(), noise=session.noise.clone(),
                          chunk_index=session.chunk_index, carried_growth=session.carried_growth)

    def close(self, session: DiTSession) -> None:
        session.close()

    @torch.inference_mode()
    def restore(self, spec: DiTSessionSpec, past: Sequence[PastChunk],
                noise_state: NoiseState | None) -> DiTSession:
        """Rebuild a session elsewhere from its finished chunks (session recovery).

        Replays each past chunk's camera and its cache-update call (t = 0 on the stored clean
        latents, the chunk's y and start token): the very call that wrote the chunk's K/V,
        rolling-window eviction included (a window rolls on a chunk's first call). An FP8 code
        cache's chunk first has its growth record redone (`kv_growth`: its denoising calls grew
        the descales and rescaled the codes before it; model/dit/kv_codes.py). Then the
        noise generator is put where it was after the last chunk: the next `step` continues
        exactly like the uninterrupted session. A past chunk with a `context` replays the
        prompt update made before it (prompt steering).
        """
        session = self.open(spec)
        self.replay(session, spec, past, noise_state)
        return session

    @torch.inference_mode()
    def replay(self, session: DiTSession, spec: DiTSessionSpec, past: Sequence[PastChunk],
               noise_state: NoiseState | None) -> None:
        """`restore`'s rebuild of an opened, fresh session (apart so that a sequence-parallel
        replica opens on every rank, where a bad spec fails without collectives, first)."""
        device = self.device
        planned = session.noise.total_latent_frames
        for chunk in past:
            if chunk.context is not None:  # a prompt update applied before this chunk
                self.update_prompt(session, chunk.context)
            plucker = session.camera.chunk(chunk.poses, chunk.intrinsics)  # [1, 384, 3, lh, lw]
            last_planned = planned is not None and (session.chunk_index + 1) * CHUNK_LATENT_FRAMES == planned
            if not (self.skip_final_update and last_planned):
                start = session.start_token
                rows = CHUNK_LATENT_FRAMES * spec.frame_seqlen
                session.caches.ensure_capacity(start + rows)
                if chunk.kv_growth is not None:  # the denoising calls' growth of the FP8 codes' descales
                    session.caches.regrow(chunk.kv_growth, start, rows)
                cam = self.dit.camera_features(plucker.to(device))
                y = chunk.y.to(device=device, dtype=torch.float32)
                x0 = chunk.latents.to(device=device, dtype=torch.float32)
                self.dit.write_kv(x0, timestep_tensor(0.0, device), y, session.text, cam, session.caches, start)
            session.chunk_index += 1
        if noise_state is not None:
            session.noise.set_state(noise_state)
