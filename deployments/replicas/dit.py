"""DiTDeployment: the DiT weights once per replica, many sessions with their KV caches.

Admission: a new session is admitted only while the replica has a free slot
(`sessions.max_sessions`) and its whole footprint (KV and cross caches, noise plan, text; plus
one chunk's camera features and activations, `DiTEngine.footprint`) fits the session budget
(`sessions.kv_budget_gib`, or the replica's memory cap minus its weights after warm-up,
`deployments/replicas/memory.py`); otherwise `Busy(retry_after_s)`, or `TooLarge` for a session that
cannot fit an empty replica or exceeds `sessions.max_attention_tokens`. The constructor warms
up every serving size (`model/warmup.py`) before Serve routes to the replica.
The ingress admits a session with `reserve` before any replica works for it (the footprint does
not depend on the prompt): a session that cannot fit is refused before its text and VAE
encodes, and its `open` then claims the reservation. Offline sessions (`/v1/videos` jobs) count
against `sessions.max_offline_sessions` apart from the live slots; a new live session must
leave every live session `sessions.min_fps` (replicas/frame_floor.py; a `restore` without a
reservation, a rebuild after a replica's loss, is not held to it). SERVING.md, Admission.
The replica is authoritative: a step for a session it does not hold raises `SessionLost`.
`restore` admits a session like `open` and rebuilds it from the ingress's journal (one
cache-update call per past chunk), so that it continues bit for bit where it stopped.
`clone` admits a session like `open` and makes it a device copy of a live session this replica
holds (a fork at its head: no chunk replayed), or of a snapshot it keeps; `SessionLost` /
`NoSnapshot` when the source is not here, `Unsupported` when the engine cannot clone (the
ingress then replays the journal).
Snapshots (`snapshot_mib` > 0, replicas/snapshots.py): before each chunk a device copy of the
session as it is is kept as `<key>#<chunks>` while the budget's spare bytes allow, and a closed
session's final state is kept (moved, not copied); `clone` copies one into a new session (a
fork below the head, a rewind, a session leaving the prefix store).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import numpy as np
import torch
from ray import serve

from camera.frames import CHUNK_LATENT_FRAMES
from deployments.config import ModelArgs, SessionArgs
from deployments.errors import (AttentionBound, Busy, ChunkLimit, Preempted, SessionLimit, SessionLost,
                                TooLarge, Unsupported)
from deployments.log import get_log
from deployments.replicas.dit_engine import EngineHealth, start_engine
from deployments.replicas.dit_slot import AdmissionPlan, DiTSlot
from deployments.replicas.engine_options import accel_options
from deployments.replicas.frame_floor import FrameFloor
from deployments.replicas.memory import resident_model_bytes, session_budget
from deployments.replicas.session_host import SessionHost
from deployments.replicas.session_table import SessionTable
from deployments.replicas.snapshots import parse_snapshot_id
from deployments import wire
from deployments.wire import ChunkStep, NoiseSnapshot, SessionOptions, StepResult
from deployments.worlds.compile_artifacts import StoreArtifacts, replica_artifacts
from deployments.worlds_args import WorldsArgs
from model.compile_cache import CompileCache
from model.engine_api import ChunkPreempted, DiTEngineProtocol, SessionFootprint
from model.parallel.launch import DEFAULT_TIMEOUT_S
from model.dit.sampler import NoiseState
from model.ready import ReadyClock
from model.session import DiTSession, DiTSessionSpec, PastChunk, SessionStatus, frame_tokens
from model.warmup import WarmupReport, allow_recompiles, warm_up_dit

GIB = 1024**3
BROKEN_RETRY_S = 1.0  # `busy` hint of a broken SP replica: the rebuild goes elsewhere, or to its successor


@serve.deployment
class DiTDeployment(SessionHost[DiTSlot]):
    """Chunk steps (4 denoising steps + cache update) of many sessions, serialised per replica."""

    slow_call_s = 6.0  # a chunk step runs 1.1-2.2 s at 464x832 on an H200
    _floor: Optional[FrameFloor] = None  # the frame-rate floor (`_ready`; none: a replica's parts in tests)

    async def __init__(self, model: ModelArgs, sessions: SessionArgs, snapshot_mib: float = 0.0,
                       parallel: int = 1, parallel_timeout_s: float = DEFAULT_TIMEOUT_S,
                       store: Optional[WorldsArgs] = None) -> None:
        """`parallel` > 1: the engine spans that many GPUs (sequence parallel, sp_dit.py): the
        replica is rank 0 in bundle 0 of its placement group (deployments/app.py `bind_dit`).
        `store` with `compile_artifacts`: compile artefacts from / to the world store."""
        self._clock = ReadyClock()
        cache_name = "dit" if parallel == 1 else "dit-sp"
        self._compile_cache = CompileCache.open(model.compile_cache_dir, cache_name)  # before anything compiles
        self._artifacts: Optional[StoreArtifacts] = replica_artifacts(
            store, cache_name, model, accel_options(model, model.device), parallel)
        if self._artifacts is not None:  # a fresh node: the store's artefacts, before anything compiles
            await self.compute_thread.run(self._artifacts.fetch, self._compile_cache)
            self._clock.mark("store_fetch")
        served = await start_engine(model, sessions, parallel, parallel_timeout_s)
        self._engine: DiTEngineProtocol = served.engine
        self._health: EngineHealth = served.health
        self._clock.mark("load")
        await self._ready(model, sessions, served.cap, snapshot_mib)
        self._replica_info.update(served.info)
        if parallel > 1:
            self._log.info("sequence-parallel replica ready", fields={"ranks": parallel, "device": model.device})

    async def _ready(self, model: ModelArgs, sessions: SessionArgs, cap: int, snapshot_mib: float = 0.0) -> None:
        """Warm up at the serving sizes, then size the session budget and start serving
        (`self._engine` is the engine the replica serves with; `self._clock` and
        `self._compile_cache` were started before it was built; snapshots only where the engine
        can clone)."""
        self._max_chunks = sessions.max_chunks
        self._max_attention_tokens = sessions.max_attention_tokens
        report = WarmupReport()
        if model.warmup:
            sizes = model.warmed_sizes()
            allow_recompiles(len(model.serving_sizes()))  # a compiled graph for each, warmed or not
            report = await self.compute_thread.run(warm_up_dit, self._engine, sizes)
        self._clock.mark("warmup")
        if model.warmup:
            await self.compute_thread.run(self._compile_cache.save)
        self._clock.mark("cache_save")
        if model.warmup and self._artifacts is not None:
            await self.compute_thread.run(self._artifacts.publish, self._compile_cache)
            self._clock.mark("store_put")
        resident = resident_model_bytes(model.device, self._engine.dit)
        budget = session_budget(sessions.kv_budget_gib, cap, resident)
        table: SessionTable[DiTSlot] = SessionTable(
            sessions.max_sessions, budget, sessions.idle_ttl_s, sessions.retry_after_s,
            max_offline_sessions=sessions.max_offline_sessions,
        )
        self._floor = FrameFloor(sessions.min_fps)
        snapshot_bytes = int(snapshot_mib * 2**20) if self._engine.capabilities.clone else 0
        self._start_host(table, lambda slot: self._engine.close(slot.session), get_log("dit"), model.device,
                         snapshot_bytes)
        ready = self._clock.split(report, self._compile_cache,
                                  None if self._artifacts is None else self._artifacts.stats())
        self._replica_info = {**report.as_dict(), "memory_cap_bytes": cap, "resident_bytes": resident,
                              "random_weights": model.random_weights, "ready": ready}
        self._log.info("ready split", fields={k: v for k, v in ready.items() if k != "compile_cache"}
                       | {"cache": ready["compile_cache"]})
        if model.random_weights:
            self._log.warning("RANDOM WEIGHTS: this DiT is NOT A REAL MODEL (load tests only)")
        self._log.info("ready", fields={"budget_gib": f"{budget / GIB:.2f}", "cap_gib": f"{cap / GIB:.2f}",
                                        "resident_gib": f"{resident / GIB:.2f}", "max_sessions": sessions.max_sessions,
                                        "warmed": report.as_dict()["warmed_sizes"], "warmup_s": f"{report.seconds:.1f}",
                                        "torch_threads": torch.get_num_threads()})

    async def reserve(self, routing_key: str, options: SessionOptions) -> str:
        """Admit a session before any work is done for it (before its prompt is encoded): its
        slot and bytes are held for the `open` that follows; `Busy` / `TooLarge` at once
        otherwise. Returns the replica id."""
        self._refuse_if_broken()
        plan = self._plan(options, 0)
        with self._refusals(routing_key, plan.need):
            self._reserve_slot(routing_key, plan.need.held, plan.need.working, reserve_only=True,
                               offline=plan.offline, bucket=plan.bucket)
        return self._replica

    async def open(self, routing_key: str, options: SessionOptions, context: np.ndarray) -> str:
        """Admit (or take the reservation of) and open a session whose prompt encodes to
        `context` float32 [L, text_dim]; returns the replica id."""
        self._refuse_if_broken()
        plan = self._plan(options, 0)
        session_spec = self._session_spec(options, context)
        await self._admit(routing_key, session_spec, plan, 0, lambda: self._engine.open(session_spec))
        self._log.info("session opened", fields={"session": routing_key, "size": f"{options.height}x{options.width}"})
        return self._replica

    async def restore(self, routing_key: str, options: SessionOptions, context: np.ndarray, past: list[wire.PastChunk],
                      noise: Optional[NoiseSnapshot]) -> str:
        """Admit a session like `open` and rebuild it from its journal: `past` chunks in order,
        `noise` the generator state after the last one. Returns the replica id."""
        self._refuse_if_broken()
        if not self._engine.capabilities.restore:
            raise SessionLost("this DiT deployment cannot rebuild sessions; start again with image and prompt")
        if len(past) > self._max_chunks:
            raise ChunkLimit(f"the session has {len(past)} chunks, more than max_chunks ({self._max_chunks})")
        plan = self._plan(options, len(past))
        session_spec = self._session_spec(options, context)
        tensors: dict[int, torch.Tensor] = {}  # equal y arrive as one shared array: keep one tensor

        def tensor(a: np.ndarray) -> torch.Tensor:
            if id(a) not in tensors:
                tensors[id(a)] = torch.tensor(a)  # a copy: Ray hands in read-only arrays
            return tensors[id(a)]

        if any(c.context is not None for c in past) and not self._engine.capabilities.update_prompt:
            raise SessionLost("this DiT deployment cannot rebuild a steered session; start again with image and prompt")
        chunks = [PastChunk(c.poses, c.intrinsics, tensor(c.y), tensor(c.latents),
                            None if c.context is None else torch.tensor(c.context, dtype=torch.float32),
                            None if c.kv_growth is None else torch.tensor(c.kv_growth))
                  for c in past]
        state = None if noise is None else NoiseState(torch.from_numpy(noise.rng.copy()), noise.whole_drawn)
        # Opened, then replayed one chunk per compute job: other sessions' chunks run between them.
        # Without a reservation a restore is a rebuild after a replica's loss: not refused by the floor.
        await self._admit(routing_key, session_spec, plan, 0, lambda: self._engine.open(session_spec), gated=False)
        steps = [(self._replay_chunk, (session_spec, c)) for c in chunks]
        await self._replay_in_turns(routing_key, steps + [(self._replay_noise, (session_spec, state))])
        self._log.info("session restored", fields={"session": routing_key, "chunks": len(past)})
        return self._replica

    def _replay_chunk(self, slot: DiTSlot, spec: DiTSessionSpec, chunk: PastChunk) -> None:
        """(Model thread.) One past chunk of a restore: its cache update."""
        self._engine.replay(slot.session, spec, [chunk], None)
        slot.chunks += 1

    def _replay_noise(self, slot: DiTSlot, spec: DiTSessionSpec, noise: Optional[NoiseState]) -> None:
        """(Model thread.) A restore's last step: the noise generator after its last chunk."""
        self._engine.replay(slot.session, spec, [], noise)

    async def clone(self, source_key: str, routing_key: str, options: SessionOptions) -> str:
        """Admit `routing_key` like `open` (`Busy` / `TooLarge`, nothing changed) and make it an
        independent copy of the live session `source_key` (a fork at its head), or of the
        snapshot `source_key` names (`<key>#<chunks>`: a fork below a head): its caches, text,
        camera, noise and chunk count, copied on the device. `SessionLost` / `NoSnapshot` when
        this replica does not hold the source, `Unsupported` when its engine cannot clone or
        `options` are not the source's. Returns the replica id.

        Routed by the source's key (its replica); the router pins `routing_key` (the second
        argument) where the call went (deployments/router.py)."""
        if not self._engine.capabilities.clone:
            raise Unsupported("this DiT deployment (sequence parallel) cannot clone sessions")
        snapshot = parse_snapshot_id(source_key)
        if snapshot is not None:
            src = await self._shelved(*snapshot)
            with self.snapshots.holding(*snapshot):  # not evicted for the copy's own admission
                await self._clone_slot(src, source_key, routing_key, options)
            return self._replica
        with self._table.hold(source_key):  # SessionLost when not held; it cannot expire meanwhile
            await self._clone_slot(self._table.get(source_key), source_key, routing_key, options)
        return self._replica

    async def _clone_slot(self, src: DiTSlot, source_key: str, routing_key: str, options: SessionOptions) -> None:
        spec = src.session.spec
        if (options.height, options.width, options.total_latent_frames) != (
                spec.height, spec.width, spec.total_latent_frames):
            raise Unsupported("a clone keeps its source's size and length")
        need = self._engine.footprint(src.height, src.width, src.kv_frames, spec.total_latent_frames)

        def clone() -> DiTSlot:
            if src.session.status is SessionStatus.CLOSED:  # closed while the clone queued
                raise SessionLost("the session to clone was closed")
            return self._copy(src)

        started = time.perf_counter()
        with self._refusals(routing_key, need):
            await self._open_slot(routing_key, need.held, clone, working=need.working, offline=options.offline,
                                  bucket=(src.height, src.width, src.windowed))
        self._record_call(routing_key, clone, 0.0, time.perf_counter() - started)
        self._metrics.admitted.inc()
        self._log.info("session cloned", fields={"session": routing_key, "from": source_key, "chunks": src.chunks})

    def _copy(self, src: DiTSlot) -> DiTSlot:
        """(Model thread.) A device copy of a slot: a clone's state, a snapshot."""
        return DiTSlot(self._engine.clone(src.session), src.height, src.width, src.kv_frames, src.chunks, src.windowed)

    def _full_attention(self, options: SessionOptions) -> bool:
        """Per session, at open and alike at restore (same spec, same budget): a session that
        declares its length and whose full-attention footprint fits the replica's whole budget
        and the attention bound attends to all its frames (exact, as the offline pipeline); an
        open-ended one, or one too long for that, gets the configured window. Without a
        configured window every session runs full attention (open-ended ones grow per chunk)."""
        if self._engine.cfg.local_attn_size == -1:
            return True
        if options.total_latent_frames is None:
            return False
        frames = options.total_latent_frames
        if frame_tokens(options.height, options.width) * frames > self._max_attention_tokens:
            return False
        budget = self._table.budget_bytes
        return budget is None or self._engine.footprint(options.height, options.width, frames, frames).total <= budget

    def _plan(self, options: SessionOptions, chunks: int) -> AdmissionPlan:
        """Attention mode, KV reservation and footprint of a session opened with `options` after
        `chunks` past chunks; `TooLarge` beyond the attention bound."""
        full_attention = self._full_attention(options)
        kv_frames = self._engine.kv_frames(options.total_latent_frames, full_attention)
        windowed = self._engine.session_cfg(full_attention).local_attn_size != -1
        if not windowed:
            kv_frames = max(kv_frames, chunks * CHUNK_LATENT_FRAMES)  # a rebuilt session holds its past
        self._check_attention(frame_tokens(options.height, options.width), kv_frames)
        need = self._engine.footprint(options.height, options.width, kv_frames, options.total_latent_frames)
        return AdmissionPlan(full_attention, kv_frames, windowed, need, options.offline,
                             (options.height, options.width, windowed))

    def _session_spec(self, options: SessionOptions, context: np.ndarray) -> DiTSessionSpec:
        """The model's spec of a session: its options, with its text context as a tensor."""
        return DiTSessionSpec(
            context=torch.tensor(context, dtype=torch.float32),  # a copy: Ray hands in read-only arrays
            height=options.height, width=options.width, seed=options.seed,
            total_latent_frames=options.total_latent_frames, translation_scale=options.translation_scale,
            intrinsics_resolution=tuple(options.intrinsics_resolution), full_attention=self._full_attention(options),
        )

    async def _admit(self, routing_key: str, spec: DiTSessionSpec, plan: AdmissionPlan, chunks: int,
                     build: Callable[[], DiTSession], gated: bool = True) -> None:
        """Reserve the session's whole footprint, or take its reservation (`Busy` when it does
        not fit now, `TooLarge` when it never can), then build it (`gated`: `_admission_gate`'s)."""
        with self._refusals(routing_key, plan.need):
            await self._open_slot(routing_key, plan.need.held,
                                  lambda: DiTSlot(build(), spec.height, spec.width, plan.kv_frames, chunks, plan.windowed),
                                  working=plan.need.working, offline=plan.offline, bucket=plan.bucket, gated=gated)
        self._metrics.admitted.inc()

    @contextmanager
    def _refusals(self, routing_key: str, need: SessionFootprint) -> Iterator[None]:
        """Count and log an admission's `Busy` / `TooLarge`."""
        try:
            yield
        except (Busy, TooLarge) as e:
            self._metrics.rejected.inc()
            self._log.info(f"session refused ({e.code.value})", fields={
                "session": routing_key, "held_mib": need.held >> 20, "working_mib": need.working >> 20,
                "retry_after_s": getattr(e, "retry_after_s", None)})
            raise

    def _check_attention(self, frame_seqlen: int, kv_frames: int) -> None:
        """The work bound: a chunk attends to at most `max_attention_tokens` tokens."""
        tokens = frame_seqlen * kv_frames
        if tokens > self._max_attention_tokens:
            raise TooLarge(f"the session's chunks would attend to {tokens} tokens ({kv_frames} latent frames of "
                           f"{frame_seqlen}); this server allows {self._max_attention_tokens}: ask for a smaller "
                           "size or fewer frames")

    async def step(self, routing_key: str, chunk: ChunkStep) -> StepResult:
        """One chunk: y [20, 3, lh, lw], poses [N, 4, 4], intrinsics [N, 4] -> x0 latents [16, 3, lh, lw].
        `chunk.context` [L, text_dim]: a prompt update (prompt steering) applied before the chunk."""
        if chunk.context is not None and not self._engine.capabilities.update_prompt:
            raise Unsupported("this DiT deployment (sequence parallel) does not support prompt_update")
        if self._health.broken is not None:  # at once, not behind the lock
            await self.close(routing_key)
            raise SessionLost("the server lost this session (a rank of its replica failed); "
                              "send image and prompt to start again")
        offline = self._table.is_offline(routing_key)
        try:
            out = await self._compute_on_early(routing_key, self._step, routing_key, chunk, prepare=self._admit_chunk)
        except Preempted:
            self._count_call("preempted")  # `stats`: chunks given up
            if self._metrics is not None:
                self._metrics.preempted.inc()
            raise
        except (SessionLost, ChunkLimit, AttentionBound, SessionLimit, Busy):  # typed: the session's state is intact
            raise
        except Exception as e:
            # The caches may be half-written: the session cannot continue. Drop it.
            self._log.exception("step failed; session dropped", fields={"session": routing_key})
            await self.close(routing_key)
            raise SessionLost(f"the server failed this chunk ({type(e).__name__}) and dropped the "
                              "session; start again with image and prompt") from e
        self._metrics.count_chunk(offline)
        self._publish()
        return out

    def _admission_gate(self, offline: bool, bucket: Any) -> None:
        """The frame-rate floor (`sessions.min_fps`, frame_floor.py): a new live session only while
        every live session keeps it; offline sessions are not held to it."""
        if not offline and self._floor is not None:
            self._floor.check(self._table.live_buckets(), bucket, self._table.retry_hint)

    def _record_call(self, routing_key: str, fn: Callable[..., Any], waited_s: float, ran_s: float,
                     counters_moved: Callable[[], dict[str, int]] = dict) -> None:
        super()._record_call(routing_key, fn, waited_s, ran_s, counters_moved)
        if self._floor is not None and getattr(fn, "__name__", "") == "_step":  # the floor's measure: the lock
            self._floor.observe(self._table.bucket(routing_key), ran_s)  # held (a given-up chunk's too)

    def record_routing_stats(self) -> dict[str, Any]:
        stats = super().record_routing_stats()
        if self._health.broken is not None:  # routers place nothing new here
            stats.update(capacity=0, free_slots=0)
        return stats

    async def check_health(self) -> None:
        await self._health.check()

    def _refuse_if_broken(self) -> None:
        if self._health.broken is not None:
            self._metrics.rejected.inc()
            raise Busy("this DiT replica lost a rank and is being replaced; retry", BROKEN_RETRY_S)

    async def preempt(self, routing_key: str, chunk_id: int) -> bool:
        """Give the session's chunk `chunk_id` up at its next denoising call, or before it starts
        (`Preempted` from its `step`; the session as before it): a driven session whose keys
        changed while the chunk ran. False (nothing changed) when the chunk is already done or
        the session is not here, or the engine cannot (`capabilities.preempt`)."""
        if not self._engine.capabilities.preempt:
            return False
        try:
            slot = self._table.get(routing_key)
        except SessionLost:
            return False
        if slot.chunks != chunk_id:
            return False
        slot.preempt_chunk = chunk_id
        return True

    def _admit_chunk(self, routing_key: str, slot: DiTSlot) -> None:
        """Chunk cap, and a growing reservation for sessions of unknown length without a window
        (`Busy` when the budget cannot hold one more chunk)."""
        if slot.chunks >= self._max_chunks:
            raise SessionLimit(f"the session produced its {self._max_chunks} chunks (max_chunks; the model's RoPE "
                               "table holds 1024 latent frames); reset to start a new one")
        needed = (slot.chunks + 1) * CHUNK_LATENT_FRAMES  # latent frames the KV cache holds after this chunk
        if needed <= slot.kv_frames or slot.windowed:
            return
        frame_seqlen = frame_tokens(slot.height, slot.width)
        if frame_seqlen * needed > self._max_attention_tokens:
            raise AttentionBound(f"the session reached the server's attention bound ({self._max_attention_tokens} "
                             "tokens); reset to start a new one, or serve with a local_attn_size window")
        held = self._engine.footprint(slot.height, slot.width, needed, None).held
        if not self._table.resize(routing_key, held):
            # capacity, not a limit of the request: the budget frees as other sessions end
            retry = self._table.retry_hint()
            raise Busy(f"the replica's KV cache budget is full and this session cannot grow; start it "
                       f"again in {retry:g} s, declare num_frames up front, or serve with "
                       "a local_attn_size window", retry)
        slot.kv_frames = needed

    def _step(self, slot: DiTSlot, publish: Callable[[StepResult], None], routing_key: str,
              step: ChunkStep) -> StepResult:
        """The chunk's latents are published after its 4 denoising calls (they go to decoding
        at once); its cache-update call runs after, before this replica's next job (where the
        engine can defer it: the sequence-parallel replica steps all at once). Before it, with
        snapshots on, the state after the chunks so far is copied (copy before write)."""
        if self.snapshots.enabled:  # copy before write: the state after the chunks so far
            self._snapshot(routing_key, slot.chunks, self._held_bytes(slot), lambda: self._copy(slot))
        if step.context is not None:
            self._engine.update_prompt(slot.session, torch.tensor(step.context, dtype=torch.float32))
        defer = self._engine.capabilities.deferred_update
        chunk = slot.chunks
        # (an engine that cannot preempt takes no such argument: the sequence-parallel one)
        preempt = {"should_stop": lambda: slot.preempt_chunk == chunk} if self._engine.capabilities.preempt else {}
        try:
            out = self._engine.step(slot.session, torch.tensor(step.y), step.poses, step.intrinsics,  # copy: read-only y
                                    defer_update=defer, **preempt)
        except ChunkPreempted:
            raise Preempted(f"chunk {chunk} was given up for newer keys; the session is as before it") from None
        finally:
            slot.preempt_chunk = None  # it can only name this chunk (`preempt` sets it while slot.chunks == chunk)
        slot.chunks += 1
        noise = slot.session.noise.state()
        timings = {**out.timings, "previous_cache_update": slot.update_s} if defer else out.timings
        reply = StepResult(latents=out.latents.numpy(), noise=NoiseSnapshot(noise.rng.numpy(), noise.whole_drawn),
                           kv_growth=None if out.kv_growth is None else out.kv_growth.numpy(),
                           timings=timings, replica=self._replica)
        publish(reply)
        if defer:
            slot.update_s = self._engine.finish_chunk(slot.session)
        return reply

    def _held_bytes(self, slot: DiTSlot) -> int:
        spec = slot.session.spec
        return self._engine.footprint(slot.height, slot.width, slot.kv_frames, spec.total_latent_frames).held

    def _final_snapshots(self, slot: DiTSlot) -> list:
        return [(slot.chunks, "", slot, self._held_bytes(slot))]
