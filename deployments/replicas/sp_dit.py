"""The sequence-parallel DiT engine: one DiTDeployment replica spread over N GPUs of one node
(Ulysses sequence parallelism, `model/parallel`, docs/PARALLEL.md).

Layout of one replica:

* its placement group has N bundles `{CPU: c, GPU: 1}` with STRICT_PACK (one node, so the
  collectives run over NVLink); the replica actor itself is rank 0 in bundle 0;
* it starts N-1 `SPRank` actors, rank r in bundle r; all N join one torch.distributed group
  (NCCL on GPUs, gloo on CPU) through a TCP rendezvous on rank 0's node;
* each rank loads the whole DiT (weights are replicated) with the serving speed options
  (`AccelOptions.for_serving`; rank 0's DiT, loaded by DiTDeployment, is brought to the same
  options) and holds, per session, the KV caches of its H/N heads, its own copy of the
  sampler state and the text embedding.

Sessions, admission, TTL and routing are DiTDeployment's, unchanged: the replica holds
`SPReplicaEngine` (`start_sp_engine`, deployments/replicas/dit_engine.py) as its engine, which forwards every open / step / close to the other ranks in the
same order (one caller, in-order actors) and runs rank 0's part itself. Steps meet in the
collectives; every rank ends a chunk with the same latents and rank 0 returns them.
Admission counts one rank's footprint (its KV heads, its token shard's camera features and
activations) against rank 0's budget (all ranks hold the same amount). The replica warms up
through all ranks before it is ready.

Failure (docs/RELIABILITY.md): a rank that dies, a collective that fails, or a rank that does
not answer within `dit_parallel_timeout_s` (the process group's collective timeout too) BREAKS
the replica at once: its ranks are killed (which ends the collectives the others were blocked
in, so no call holds the replica's lock behind them), every session it held answers
`session_lost` at its next call (the ingress then rebuilds it from the journal on another
replica, `restore`), new opens and restores get `busy` and its routing stats report no
capacity, and `check_health` fails so that Serve replaces the replica (its placement group goes
with it). `restore` rebuilds a journaled session on all ranks: each opens it (no collectives:
a bad spec stops there), then all replay its past chunks together.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import ray
import torch
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deployments.config import ModelArgs, ReplicaArgs, SessionArgs
from deployments.replicas.engine_options import accel_options, engine_options
from deployments.replicas.memory import cap_process
from model.accel import AccelOptions
from model.config import DiTConfig
from model.engine_api import ChunkOutput, DiTEngineProtocol, EngineCapabilities, SessionFootprint
from model.compile_cache import CompileCache
from model.factory import load_dit_engine
from model.parallel.launch import DEFAULT_TIMEOUT_S
from model.parallel import SPDiTEngine, init_sp_group, load_sp_dit_engine, rank_device, sp_engine
from model.dit.sampler import NoiseState
from model.session import DiTSession, DiTSessionSpec, PastChunk

PLACEMENT_STRATEGY = "STRICT_PACK"  # all ranks of a replica on one node
RANK_NAMESPACE = "lwf-sp-ranks"  # the rank actors' names live here (stats()["ranks"] lists them)


def sp_placement(replica: ReplicaArgs, parallel: int) -> dict[str, Any]:
    """Serve options that give each replica N bundles of the args' per-rank CPUs and GPUs."""
    bundle = {k: v for k, v in (("CPU", replica.num_cpus), ("GPU", replica.num_gpus)) if v > 0}
    if not bundle:
        raise ValueError("a sequence-parallel DiT needs num_cpus or num_gpus > 0 per rank (bundle)")
    bundle.update(replica.resources)
    options: dict[str, Any] = {"placement_group_bundles": [bundle] * parallel,
                               "placement_group_strategy": PLACEMENT_STRATEGY}
    if replica.label_selector:
        options["placement_group_bundle_label_selector"] = [dict(replica.label_selector)] * parallel
    return options


@ray.remote
class SPRank:
    """Rank r >= 1 of an SP replica: its shards of sessions by `shard_id` (a uuid rank 0 gives
    each session it opens; not the routing routing_key), driven by rank 0 (an in-order actor)."""

    def __init__(self, rank: int, world: int, init_method: str, model: ModelArgs, options: AccelOptions,
                 timeout_s: float) -> None:
        CompileCache.open(model.compile_cache_dir, f"dit-sp-rank{rank}")  # inductor's and Triton's caches
        device = rank_device(model.device)
        group = init_sp_group(rank, world, init_method, device, timeout_s)
        self._engine = load_sp_dit_engine(group=group, **engine_options(model, device, options))
        self._sessions: dict[str, DiTSession] = {}

    def ping(self) -> None:
        """Liveness (and, the first time, that loading finished)."""

    def open(self, shard_id: str, spec: DiTSessionSpec) -> None:
        self._sessions[shard_id] = self._engine.open(spec)

    def step(self, shard_id: str, y: torch.Tensor, poses: np.ndarray, intrinsics: np.ndarray) -> None:
        self._engine.step(self._sessions[shard_id], y, poses, intrinsics)

    def replay(self, shard_id: str, spec: DiTSessionSpec, past: Sequence[PastChunk], noise: Optional[NoiseState]) -> None:
        self._engine.replay(self._sessions[shard_id], spec, past, noise)

    def close(self, shard_id: str) -> None:
        session = self._sessions.pop(shard_id, None)
        if session is not None:
            self._engine.close(session)


class RankFailure(RuntimeError):
    """A rank died, stopped answering or failed a collective: the replica cannot compute any more."""


class SPReplicaEngine(DiTEngineProtocol):
    """The DiT engine interface (model/engine_api.py) over all ranks of the replica: no prompt
    steering, and a step runs its cache update at once on every rank.

    Every wait on the other ranks is bounded by `timeout_s`; any failure of a rank or of a step
    (the ranks are then out of step) breaks the engine for good (`broken`, `RankFailure`).
    """

    capabilities = EngineCapabilities(restore=True, update_prompt=False, deferred_update=False, preempt=False,
                                      clone=False)

    def __init__(self, local: SPDiTEngine, ranks: list[ray.actor.ActorHandle], timeout_s: float,
                 rank_names: Sequence[str] = ()) -> None:
        self._local = local
        self._ranks = ranks
        self.rank_names = list(rank_names)  # the rank actors' names in RANK_NAMESPACE (stats()["ranks"])
        self._timeout_s = timeout_s
        self._shard_ids: dict[DiTSession, str] = {}  # rank 0's session -> its shard_id on the other ranks
        self._broken: Optional[str] = None
        self._lock = threading.Lock()

    @property
    def broken(self) -> Optional[str]:
        """Why the engine broke, or None."""
        return self._broken

    @property
    def cfg(self) -> DiTConfig:
        return self._local.cfg

    @property
    def dit(self) -> torch.nn.Module:
        return self._local.dit

    def kv_frames(self, total_latent_frames: int | None, full_attention: bool = False) -> int:
        return self._local.kv_frames(total_latent_frames, full_attention)

    def session_cfg(self, full_attention: bool):
        return self._local.session_cfg(full_attention)

    def session_bytes(self, spec_h: int, spec_w: int, kv_frames: int) -> int:
        return self._local.session_bytes(spec_h, spec_w, kv_frames)

    def footprint(self, height: int, width: int, kv_frames: int,
                  total_latent_frames: int | None) -> SessionFootprint:
        return self._local.footprint(height, width, kv_frames, total_latent_frames)

    def open(self, spec: DiTSessionSpec) -> DiTSession:
        self._check()
        session = self._local.open(spec)  # no collectives: rank 0 first, so a bad spec stops here
        shard_id = uuid.uuid4().hex
        self._wait([r.open.remote(shard_id, spec) for r in self._ranks], "open")
        self._shard_ids[session] = shard_id
        return session

    def restore(self, spec: DiTSessionSpec, past: Sequence[PastChunk], noise: Optional[NoiseState]) -> DiTSession:
        """DiTEngine.restore on every rank: open everywhere, then replay together."""
        session = self.open(spec)
        self.replay(session, spec, past, noise)
        return session

    def replay(self, session: DiTSession, spec: DiTSessionSpec, past: Sequence[PastChunk],
               noise: Optional[NoiseState]) -> None:
        """DiTEngine.replay on every rank, together (the replica replays a chunk at a time)."""
        past_ref = ray.put(list(past))  # one copy in the object store for all ranks
        shard_id = self._shard_ids[session]
        self._together([r.replay.remote(shard_id, spec, past_ref, noise) for r in self._ranks],
                       lambda: self._local.replay(session, spec, past, noise), "replay")

    def step(self, session: DiTSession, y: torch.Tensor, poses: np.ndarray,
             intrinsics: np.ndarray, defer_update: bool = False) -> ChunkOutput:
        if defer_update:  # not among its capabilities
            raise ValueError("the sequence-parallel engine steps every rank in one call: no deferred update")
        self._check()
        shard_id = self._shard_ids[session]
        others = [r.step.remote(shard_id, y, poses, intrinsics) for r in self._ranks]  # meet in the collectives
        return self._together(others, lambda: self._local.step(session, y, poses, intrinsics), "step")

    def finish_chunk(self, session: DiTSession) -> float:
        return 0.0  # no step leaves a cache update behind

    def update_prompt(self, session: DiTSession, context: torch.Tensor) -> None:
        raise NotImplementedError("the sequence-parallel engine does not steer prompts")

    def clone(self, session: DiTSession) -> DiTSession:
        raise NotImplementedError("the sequence-parallel engine does not clone sessions (its shards live on "
                                  "every rank): a fork replays the journal")

    def close(self, session: DiTSession) -> None:
        shard_id = self._shard_ids.pop(session, None)
        self._local.close(session)
        if shard_id is not None and self._broken is None:
            self._wait([r.close.remote(shard_id) for r in self._ranks], "close")

    async def ping(self) -> None:
        self._check()
        try:
            async with asyncio.timeout(self._timeout_s):
                await asyncio.gather(*(r.ping.remote() for r in self._ranks))
        except Exception as e:  # noqa: BLE001 - dead, or not answering in time
            self._break(f"ping: {type(e).__name__}: {e}")
            raise RankFailure(self._broken) from e

    async def check(self) -> None:
        """Serve's health check (`EngineHealth`): fails once broken, or when a rank does not answer."""
        if self._broken is not None:
            raise RankFailure(f"sequence-parallel replica broken: {self._broken}")
        await self.ping()

    def _together(self, others: list[ray.ObjectRef], local, what: str):
        """Rank 0's part `local()` while the other ranks run theirs (`others`). A watcher breaks
        the engine as soon as another rank fails, which ends rank 0's collectives at once."""
        done = threading.Event()

        def watch() -> None:
            pending = list(others)
            while pending and not done.is_set():
                ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                for ref in ready:
                    try:
                        ray.get(ref)
                    except Exception as e:  # noqa: BLE001
                        self._break(f"{what} on another rank: {type(e).__name__}: {e}")
                        return

        watcher = threading.Thread(target=watch, daemon=True, name=f"sp-{what}-watch")
        watcher.start()
        try:
            out = local()
        except Exception as e:
            self._break(self._broken or f"{what} on rank 0: {type(e).__name__}: {e}")
            raise RankFailure(self._broken) from e
        finally:
            done.set()
        self._wait(others, what)
        return out

    def _wait(self, refs: list[ray.ObjectRef], what: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=self._timeout_s)
        except Exception as e:  # noqa: BLE001 - a rank died, failed, or did not answer in time
            self._break(f"{what}: {type(e).__name__}: {e}")
            raise RankFailure(self._broken) from e

    def _check(self) -> None:
        if self._broken is not None:
            raise RankFailure(self._broken)

    def _break(self, why: str) -> None:
        """Give the replica up: kill the other ranks (their collectives end; rank 0's fail on
        the closed connections) and abort rank 0's group."""
        with self._lock:
            if self._broken is not None:
                return
            self._broken = why
        for r in self._ranks:
            try:
                ray.kill(r, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            torch.distributed.distributed_c10d._abort_process_group()
        except Exception:  # noqa: BLE001 - not every backend/version can abort; the kills suffice
            pass


def _rendezvous() -> str:
    """A TCP rendezvous address on this node (a port free now; the group binds it at once)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"


async def start_sp_engine(model: ModelArgs, sessions: SessionArgs, parallel: int,
                          timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[SPReplicaEngine, int]:
    """Rank 0's engine over the `parallel` ranks of this replica's placement group (ranks
    1..N-1 started as actors, one per bundle), once every rank has loaded; and the process's
    memory cap, set before rank 0 loads its DiT."""
    pg = get_current_placement_group()
    if parallel < 2 or pg is None or len(pg.bundle_specs) != parallel:
        raise ValueError(f"a sequence-parallel DiTDeployment over {parallel} ranks needs a placement group of "
                         f"{parallel} bundles (deploy it through app.bind_dit)")
    device = rank_device(model.device)
    options = accel_options(model, device)
    init_method = _rendezvous()
    names = [f"{uuid.uuid4().hex[:12]}-rank{r}" for r in range(1, parallel)]
    ranks = [
        SPRank.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            num_cpus=pg.bundle_specs[r].get("CPU", 0), num_gpus=pg.bundle_specs[r].get("GPU", 0),
            name=name, namespace=RANK_NAMESPACE, max_restarts=0,
        ).remote(r, parallel, init_method, model, options, timeout_s)
        for r, name in zip(range(1, parallel), names)
    ]
    group = await asyncio.to_thread(init_sp_group, 0, parallel, init_method, device, timeout_s)
    cap = cap_process(model.device, sessions.memory_fraction)
    base = load_dit_engine(**engine_options(model, device, options))  # rank 0's DiT
    engine = SPReplicaEngine(sp_engine(base, group, options), ranks, timeout_s, names)
    await engine.ping()  # the other ranks have loaded
    return engine, cap
