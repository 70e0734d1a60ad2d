"""VaeDeployment deployment: per-session conditioning encode, streaming decode and fMP4 mux.

Each session holds a `VaeSession` (encoder cache for y, decoder cache) and its `Fmp4Muxer`,
or none when it was opened with `raw_frames` (the clip mode of deployments/clip: its clients
want the decoded frames themselves, so they leave as raw RGB uint8 bytes, never H.264).
Calls for a session this replica does not hold raise `SessionLost`. `restore` rebuilds a
session from the ingress's journal by replaying its conditions and decodes and counting the
decoded frames into the muxer (its chunks are encoded by a fresh H.264 encoder each,
media/fmp4.py: the muxer's state is its counters), so that the caches and the muxer are those
of the uninterrupted session and its next fragment is byte-identical. `clone` admits a session
as a device copy of a live session held here (a fork at its head): its image, both causal
caches and its muxer's counters; or of a snapshot kept here.

Snapshots (`snapshot_mib` > 0, replicas/snapshots.py): the encoder's cache before each
condition and the decoder's (with the image and the muxer's counters) before each decode are
copied and kept apart, as `<key>#<k>` parts "enc" and "dec" (a session may condition chunk
k + 1 before it decodes chunk k), and a closed session's are kept as they are; the state after
k chunks is the two parts of k, which `clone` copies into a new session.

Admission counts bytes, like the DiT's: a session's footprint at its output size (its encoder
and decoder caches and image held between chunks, plus one call's activations as a
reservation; `model/vae/footprint.py`, shapes probed from the model itself after warm-up) is
reserved against the budget (`sessions.vae_budget_gib`, else on CUDA the process cap of its
`num_gpus` share minus what it holds after warm-up). Beyond it: `Busy(retry_after_s)`, never
an out-of-memory error; a session that cannot fit an empty replica: `TooLarge`. Counting
sessions alone let three 464x832 sessions run a 0.10 share of an H200 out of memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from ray import serve

from camera.frames import FPS
from deployments.config import ModelArgs, SessionArgs
from deployments.log import get_log
from deployments.errors import Busy, SessionLost, TooLarge
from deployments.replicas.memory import cap_process, resident_model_bytes, session_budget
from deployments.replicas.session_host import SessionHost
from deployments.replicas.session_table import SessionTable
from deployments.replicas.snapshots import parse_snapshot_id
from deployments.wire import SessionOptions
from deployments.worlds.compile_artifacts import replica_artifacts
from deployments.worlds_args import WorldsArgs
from media.fmp4 import Fmp4Muxer
from model.accel import AccelOptions
from model.compile_cache import CompileCache
from model.factory import load_vae_engine
from model.ready import ReadyClock
from model.session import SessionStatus, VaeSession
from model.vae.cache import VaeCache
from model.vae.footprint import CacheLayout
from model.warmup import WarmupReport, allow_recompiles, warm_up_vae


@dataclass(slots=True)
class VaeSlot:
    session: VaeSession
    muxer: Optional[Fmp4Muxer]  # None: a raw-frames session


@dataclass(frozen=True, slots=True)
class DecoderSnapshot:
    """The decoder's side of a session after k decodes: what a snapshot keeps of it."""

    image: torch.Tensor  # the session's (never written in place: shared, not copied)
    cache: VaeCache
    muxer: Optional[Fmp4Muxer]

    @classmethod
    def of(cls, slot: VaeSlot) -> "DecoderSnapshot":
        """The slot's decoder side as it is (not copied: a closed session's)."""
        return cls(slot.session.image, slot.session.dec_cache, slot.muxer)

    def copy(self) -> "DecoderSnapshot":
        """A copy of the cache (on the device) and of the muxer's counters; the image shared."""
        return DecoderSnapshot(self.image, self.cache.clone(), None if self.muxer is None else self.muxer.clone())

    @property
    def nbytes(self) -> int:
        return self.image.nbytes + self.cache.nbytes


@serve.deployment
class VaeDeployment(SessionHost[VaeSlot]):
    """Conditioning encode (y per chunk) and decode + mux (fMP4 per chunk) of many sessions."""

    slow_call_s = 1.0  # an encode or decode + mux runs 0.1-0.4 s at 464x832 on an H200

    async def __init__(self, model: ModelArgs, sessions: SessionArgs, max_sessions: int,
                       snapshot_mib: float = 0.0, store: Optional[WorldsArgs] = None) -> None:
        """`store` with `compile_artifacts`: compile artefacts from / to the world store."""
        clock = ReadyClock()
        compile_cache = CompileCache.open(model.compile_cache_dir, "vae")  # before anything compiles
        options = AccelOptions.for_serving(model.device, vae_compile=model.vae_compile)
        artifacts = replica_artifacts(store, "vae", model, options)
        if artifacts is not None:  # a fresh node: the store's artefacts, before anything compiles
            await self.compute_thread.run(artifacts.fetch, compile_cache)
            clock.mark("store_fetch")
        cap = cap_process(model.device, None) if model.device == "cuda" else None  # its num_gpus share
        self._engine = load_vae_engine(model.preset, model.checkpoint, model.vae_dtype, model.device,
                                       options=options, random_weights=model.random_weights)
        clock.mark("load")
        report = WarmupReport()
        if model.warmup:  # compile, cuDNN autotuning and x264 at every serving size, before traffic
            sizes = model.warmed_sizes()
            allow_recompiles(len(model.serving_sizes()))  # a compiled graph for each, warmed or not
            report = await self.compute_thread.run(warm_up_vae, self._engine, sizes,
                                             consumer=lambda hw: Fmp4Muxer(hw[1], hw[0], FPS).add_chunk)
        clock.mark("warmup")
        if model.warmup:
            await self.compute_thread.run(compile_cache.save)
        clock.mark("cache_save")
        if model.warmup and artifacts is not None:
            await self.compute_thread.run(artifacts.publish, compile_cache)
            clock.mark("store_put")
        # The caches' shapes, read from one probe session (at a warmed size: no new compilation).
        self._layout = await self.compute_thread.run(CacheLayout.probe, self._engine, *model.serving_sizes()[:1])
        clock.mark("probe")
        resident = resident_model_bytes(model.device, self._engine.vae)
        budget = None  # on the CPU without vae_budget_gib: slots only, as before
        if sessions.vae_budget_gib is not None or cap is not None:
            budget = session_budget(sessions.vae_budget_gib, cap or 0, resident)
        table: SessionTable[VaeSlot] = SessionTable(
            max_sessions, budget, sessions.idle_ttl_s, sessions.retry_after_s
        )
        self._start_host(table, lambda slot: self._engine.close(slot.session), get_log("vae"), model.device,
                         int(snapshot_mib * 2**20))
        ready = clock.split(report, compile_cache, None if artifacts is None else artifacts.stats())
        self._replica_info = {**report.as_dict(), "memory_cap_bytes": cap, "resident_bytes": resident,
                              "random_weights": model.random_weights, "ready": ready}
        self._log.info("ready split", fields={k: v for k, v in ready.items() if k != "compile_cache"}
                       | {"cache": ready["compile_cache"]})
        if model.random_weights:
            self._log.warning("RANDOM WEIGHTS: this VAE is NOT A REAL MODEL (load tests only)")
        self._log.info("ready", fields={"warmed": report.as_dict()["warmed_sizes"], "warmup_s": f"{report.seconds:.1f}"})

    async def open(self, routing_key: str, options: SessionOptions, image: np.ndarray) -> str:
        """Start a session from its RGB uint8 image [H0, W0, 3] at its output size
        (`options.resolution`); `options.raw_frames`: its chunks come back as raw RGB uint8
        bytes, not fMP4."""
        height, width = options.resolution
        await self._admit(routing_key, height, width, lambda: self._new_slot(image, options), options.offline)
        self._log.info("session opened", fields={"session": routing_key, "resolution": f"{height}x{width}"})
        return self._replica

    async def restore(self, routing_key: str, options: SessionOptions, image: np.ndarray, conditioned: int,
                      decoded: list[np.ndarray]) -> str:
        """Rebuild a session opened with `options` and `image`: `conditioned` conditions done,
        then the chunks `decoded` (latents [16, 3, lh, lw] each, in order) decoded and muxed.
        Opened, then replayed one condition or decode per compute job: other sessions' calls run
        between them (`_replay_in_turns`)."""
        await self._admit(routing_key, *options.resolution, lambda: self._new_slot(image, options), options.offline)
        steps = [(self._replay_condition, ())] * conditioned + [(self._replay_decode, (z,)) for z in decoded]
        await self._replay_in_turns(routing_key, steps)
        self._log.info("session restored", fields={"session": routing_key, "conditioned": conditioned,
                                                   "decoded": len(decoded)})
        return self._replica

    def _replay_condition(self, slot: VaeSlot) -> None:
        """(Model thread.) One condition of a restore, its y dropped."""
        self._engine.condition(slot.session)

    def _replay_decode(self, slot: VaeSlot, latents: np.ndarray) -> None:
        """(Model thread.) One decode of a restore: its bytes were sent, only the muxer's counters move."""
        frames = self._engine.decode(slot.session, torch.tensor(latents))
        if slot.muxer is not None:
            slot.muxer.skip_chunk(len(frames))

    async def clone(self, source_key: str, routing_key: str, options: Optional[SessionOptions] = None) -> str:
        """Admit `routing_key` like `open` (`Busy` / `TooLarge`, nothing changed) and make it an
        independent copy of the live session `source_key` (its image and causal caches, on the
        device, and its muxer's counters), or of the snapshot it names (`<key>#<k>`).
        `SessionLost` / `NoSnapshot` when the source is not here. Routed by the source's key;
        the router pins `routing_key` (the second argument) where the call went. Returns the
        replica id. `options`: the new session's (its class; absent: a live source's, else live)."""
        offline = self._table.is_offline(source_key) if options is None else options.offline
        snapshot = parse_snapshot_id(source_key)
        if snapshot is not None:
            enc, dec = await self._snapshot_parts(*snapshot)
            started = time.perf_counter()
            with self.snapshots.holding(*snapshot, "enc"), self.snapshots.holding(*snapshot, "dec"):
                await self._admit(routing_key, dec.image.shape[1], dec.image.shape[2],
                                  lambda: self._from_snapshot(snapshot[1], enc, dec), offline)
            self._record_call(routing_key, self._from_snapshot, 0.0, time.perf_counter() - started)
            self._log.info("session cloned", fields={"session": routing_key, "from": source_key})
            return self._replica
        with self._table.hold(source_key):  # SessionLost when not held; it cannot expire meanwhile
            src = self._table.get(source_key)

            def clone() -> VaeSlot:
                if src.session.status is SessionStatus.CLOSED:  # closed while the clone queued
                    raise SessionLost("the session to clone was closed")
                return VaeSlot(self._engine.clone(src.session), None if src.muxer is None else src.muxer.clone())

            started = time.perf_counter()
            await self._admit(routing_key, src.session.height, src.session.width, clone, offline)
            self._record_call(routing_key, clone, 0.0, time.perf_counter() - started)
        self._log.info("session cloned", fields={"session": routing_key, "from": source_key})
        return self._replica

    async def _snapshot_parts(self, routing_key: str, chunks: int) -> tuple[VaeCache, DecoderSnapshot]:
        enc = await self._shelved(routing_key, chunks, "enc")
        return enc, await self._shelved(routing_key, chunks, "dec")

    def _final_snapshots(self, slot: VaeSlot) -> list:
        session, dec = slot.session, DecoderSnapshot.of(slot)
        return [(session.encoded_chunks, "enc", session.enc_cache, session.enc_cache.nbytes),
                (session.decoded_chunks, "dec", dec, dec.nbytes)]

    @staticmethod
    def _from_snapshot(chunks: int, enc: VaeCache, dec: DecoderSnapshot) -> VaeSlot:
        """(Model thread.) A new slot from a snapshot's two parts, copied on the device."""
        with torch.inference_mode():  # the caches are inference tensors
            copy = dec.copy()
            session = VaeSession(image=dec.image.clone(), enc_cache=enc.clone(), dec_cache=copy.cache,
                                 encoded_chunks=chunks, decoded_chunks=chunks)
        return VaeSlot(session, copy.muxer)

    async def _admit(self, routing_key: str, height: int, width: int, build, offline: bool = False) -> None:
        """Reserve the session's footprint at its size (`Busy` when it does not fit now,
        `TooLarge` when it never can), then build it; `offline`: its class (the compute lock's)."""
        need = self._layout.footprint(height, width)
        try:
            await self._open_slot(routing_key, need.held, build, working=need.working, offline=offline)
        except (Busy, TooLarge) as e:
            self._metrics.rejected.inc()
            self._log.info(f"session refused ({e.code.value})", fields={
                "session": routing_key, "held_mib": need.held >> 20, "working_mib": need.working >> 20})
            raise
        self._metrics.admitted.inc()

    def _new_slot(self, image: np.ndarray, options: SessionOptions) -> VaeSlot:
        writable = np.array(image)  # Ray hands in read-only arrays; torch wants to own a copy
        height, width = options.resolution
        muxer = None if options.raw_frames else Fmp4Muxer(width, height, FPS)
        return VaeSlot(self._engine.open(writable, height, width), muxer)

    async def condition(self, routing_key: str) -> np.ndarray:
        """The next chunk's conditioning y, float32 [20, 3, lh, lw]."""
        return await self._compute_on(routing_key, self._condition, routing_key)

    async def decode(self, routing_key: str, latents: np.ndarray) -> dict[str, Any]:
        """Decode one chunk of latents [16, 3, lh, lw] and mux it: the chunk's fMP4 bytes."""
        return await self._compute_on(routing_key, self._decode, latents, routing_key)

    def _condition(self, slot: VaeSlot, routing_key: str = "") -> np.ndarray:
        if self.snapshots.enabled:  # copy before write: the encoder after the conditions so far
            cache = slot.session.enc_cache
            self._snapshot(routing_key, slot.session.encoded_chunks, cache.nbytes, cache.clone, "enc")
        return self._engine.condition(slot.session).numpy()  # CPU float32

    def _decode(self, slot: VaeSlot, latents: np.ndarray, routing_key: str = "") -> dict[str, Any]:
        if self.snapshots.enabled:  # copy before write: the decoder after the decodes so far
            dec = DecoderSnapshot.of(slot)
            self._snapshot(routing_key, slot.session.decoded_chunks, dec.nbytes, dec.copy, "dec")
        t0 = time.perf_counter()
        frames = self._engine.decode(slot.session, torch.tensor(latents))  # (a copy) -> uint8 [T, h, w, 3]
        t1 = time.perf_counter()
        if slot.muxer is None:  # raw-frames session: [T, h, w, 3] uint8, C order
            video, mime_type = np.ascontiguousarray(frames).tobytes(), None
        else:  # init segment + moof/mdat first, then moof/mdat
            video, mime_type = slot.muxer.add_chunk(frames), slot.muxer.mime_type
        return {
            "video": video,
            "num_frames": int(frames.shape[0]),
            "mime_type": mime_type,
            "timings": {"vae_decode": t1 - t0, "mux": time.perf_counter() - t1},
            "replica": self._replica,
        }
