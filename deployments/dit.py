"""DiTDeployment: the DiT weights once per replica, many sessions with their KV caches.

Admission: a new session is admitted only while the replica has a free slot
(`sessions.max_sessions`) and its caches fit the cache budget (`sessions.kv_budget_gib`, or a
share of the free device memory measured after loading); otherwise `Busy(retry_after_s)`.
The replica is authoritative: a step for a session it does not hold raises `SessionLost`.
`restore` admits a session like `open` and rebuilds it from the ingress's journal (one
cache-update call per past chunk), so that it continues bit for bit where it stopped.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from ray import serve

from camera.frames import CHUNK_LATENT_FRAMES
from deployments.config import ModelArgs, SessionArgs
from deployments.errors import Busy, ChunkLimit, SessionLost
from deployments.log import get_log
from deployments.session_host import SessionHost
from deployments.session_table import SessionTable
from deployments.wire import DiTOpenSpec, WireNoise, WirePastChunk
from model.accel import AccelOptions
from model.factory import load_dit_engine
from model.sampler import NoiseState
from model.session import DiTSession, DiTSessionSpec, PastChunk

GIB = 1024**3
FREE_MEMORY_SHARE = 0.8  # of the memory free after loading, when no kv_budget_gib is given


@dataclass(slots=True)
class DiTSlot:
    session: DiTSession
    height: int
    width: int
    kv_frames: int  # latent frames the reservation covers
    chunks: int = 0


def free_memory_bytes(device: str) -> int:
    """Free memory of the serving device now (CUDA: the current GPU; CPU: available RAM)."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@serve.deployment
class DiTDeployment(SessionHost[DiTSlot]):
    """Chunk steps (4 denoising steps + cache update) of many sessions, serialised per replica."""

    async def __init__(self, model: ModelArgs, sessions: SessionArgs) -> None:
        self._engine = load_dit_engine(
            model.preset, model.checkpoint, model.dtype, model.device,
            local_attn_size=model.local_attn_size, sink_size=model.sink_size,
            options=AccelOptions.for_serving(model.device, compile=model.compile, fp8=model.fp8),
        )
        self._max_chunks = sessions.max_chunks
        budget = (
            int(sessions.kv_budget_gib * GIB) if sessions.kv_budget_gib is not None
            else int(free_memory_bytes(model.device) * FREE_MEMORY_SHARE)
        )
        table: SessionTable[DiTSlot] = SessionTable(
            sessions.max_sessions, budget, sessions.idle_ttl_s, sessions.retry_after_s
        )
        self._start_host(table, lambda slot: self._engine.close(slot.session), get_log("dit"), model.device)
        self._log.info("ready", fields={"budget_gib": f"{budget / GIB:.2f}", "max_sessions": sessions.max_sessions,
                                        "torch_threads": torch.get_num_threads()})

    async def open(self, key: str, spec: DiTOpenSpec) -> str:
        """Admit and open a session; returns the replica id."""
        session_spec = self._session_spec(spec)
        await self._admit(key, session_spec, 0, lambda: self._engine.open(session_spec))
        self._log.info("session opened", fields={"session": key, "size": f"{spec.height}x{spec.width}"})
        return self._replica

    async def restore(self, key: str, spec: DiTOpenSpec, past: list[WirePastChunk],
                      noise: Optional[WireNoise]) -> str:
        """Admit a session like `open` and rebuild it from its journal: `past` chunks in order,
        `noise` the generator state after the last one. Returns the replica id."""
        if not hasattr(self._engine, "restore"):
            raise SessionLost("this DiT deployment cannot rebuild sessions; start again with image and prompt")
        if len(past) > self._max_chunks:
            raise ChunkLimit(f"the session has {len(past)} chunks, more than max_chunks ({self._max_chunks})")
        session_spec = self._session_spec(spec)
        tensors: dict[int, torch.Tensor] = {}  # equal y arrive as one shared array: keep one tensor

        def tensor(a: np.ndarray) -> torch.Tensor:
            if id(a) not in tensors:
                tensors[id(a)] = torch.tensor(a)  # a copy: Ray hands in read-only arrays
            return tensors[id(a)]

        chunks = [PastChunk(poses, intrinsics, tensor(y), tensor(lat)) for poses, intrinsics, y, lat in past]
        state = None if noise is None else NoiseState(torch.from_numpy(noise[0].copy()), noise[1])
        await self._admit(key, session_spec, len(past), lambda: self._engine.restore(session_spec, chunks, state))
        self._log.info("session restored", fields={"session": key, "chunks": len(past)})
        return self._replica

    @staticmethod
    def _session_spec(spec: DiTOpenSpec) -> DiTSessionSpec:
        return DiTSessionSpec(
            context=torch.tensor(spec.context, dtype=torch.float32),  # a copy: Ray hands in read-only arrays
            height=spec.height, width=spec.width, seed=spec.seed, total_latent_frames=spec.total_latent_frames,
            translation_scale=spec.translation_scale, intrinsics_resolution=tuple(spec.intrinsics_resolution),
        )

    async def _admit(self, key: str, spec: DiTSessionSpec, chunks: int, build: Callable[[], DiTSession]) -> None:
        """Reserve the session's caches (`Busy` when they do not fit), then build it."""
        kv_frames = self._engine.kv_frames(spec.total_latent_frames)
        if self._engine.cfg.local_attn_size == -1:
            kv_frames = max(kv_frames, chunks * CHUNK_LATENT_FRAMES)  # a rebuilt session holds its past
        nbytes = self._engine.session_bytes(spec.height, spec.width, kv_frames)
        try:
            await self._open_slot(key, nbytes, lambda: DiTSlot(build(), spec.height, spec.width, kv_frames, chunks))
        except Busy:
            self._metrics.rejected.inc()
            self._log.info("session refused (busy)", fields={"session": key, "kv_mib": nbytes >> 20})
            raise
        self._metrics.admitted.inc()

    async def step(self, key: str, y: np.ndarray, poses: np.ndarray, intrinsics: np.ndarray) -> dict[str, Any]:
        """One chunk: y [20, 3, lh, lw], poses [N, 4, 4], intrinsics [N, 4] -> x0 latents [16, 3, lh, lw]."""
        try:
            out = await self._compute_on(key, self._step, y, poses, intrinsics, prepare=self._admit_chunk)
        except (SessionLost, ChunkLimit, Busy):  # typed: the session's state is intact
            raise
        except Exception as e:
            # The caches may be half-written: the session cannot continue. Drop it.
            self._log.exception("step failed; session dropped", fields={"session": key})
            await self.close(key)
            raise SessionLost(f"the server failed this chunk ({type(e).__name__}) and dropped the "
                              "session; start again with image and prompt") from e
        self._publish()
        return out

    def _admit_chunk(self, key: str, slot: DiTSlot) -> None:
        """Chunk cap, and a growing reservation for sessions of unknown length without a window
        (`Busy` when the budget cannot hold one more chunk)."""
        if slot.chunks >= self._max_chunks:
            raise ChunkLimit(f"the session reached max_chunks ({self._max_chunks}); reset to start a new one")
        needed = (slot.chunks + 1) * CHUNK_LATENT_FRAMES  # latent frames the KV cache holds after this chunk
        if needed <= slot.kv_frames or self._engine.cfg.local_attn_size != -1:
            return
        if not self._table.resize(key, self._engine.session_bytes(slot.height, slot.width, needed)):
            # capacity, not a limit of the request: the budget frees as other sessions end
            raise Busy(f"the replica's KV cache budget is full and this session cannot grow; start it "
                       f"again in {self._table.retry_after_s:g} s, declare num_frames up front, or serve with "
                       "a local_attn_size window", self._table.retry_after_s)
        slot.kv_frames = needed

    def _step(self, slot: DiTSlot, y: np.ndarray, poses: np.ndarray, intrinsics: np.ndarray) -> dict[str, Any]:
        out = self._engine.step(slot.session, torch.tensor(y), poses, intrinsics)  # copy: y arrives read-only
        slot.chunks += 1
        noise = slot.session.noise.state()
        return {
            "latents": out.latents.numpy(),  # float32 [16, 3, lh, lw]
            "noise": (noise.rng.numpy(), noise.whole_drawn),  # for the ingress's journal
            "timings": out.timings,
            "replica": self._replica,
        }
