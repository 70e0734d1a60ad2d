"""SPDiTDeployment: one DiTDeployment replica spread over N GPUs of one node (Ulysses sequence
parallelism, `model/parallel`, docs/PARALLEL.md).

Layout of one replica:

* its placement group has N bundles `{CPU: c, GPU: 1}` with STRICT_PACK (one node, so the
  collectives run over NVLink); the replica actor itself is rank 0 in bundle 0;
* it starts N-1 `SPRank` actors, rank r in bundle r; all N join one torch.distributed group
  (NCCL on GPUs, gloo on CPU) through a TCP rendezvous on rank 0's node;
* each rank loads the whole DiT (weights are replicated) with the serving speed options
  (`AccelOptions.for_serving`; rank 0's DiT, loaded by DiTDeployment, is brought to the same
  options) and holds, per session, the KV caches of its H/N heads, its own copy of the
  sampler state and the text embedding.

Sessions, admission, TTL and routing are DiTDeployment's, unchanged: the replica swaps its engine
for `SPReplicaEngine`, which forwards every open / step / close to the other ranks in the
same order (one caller, in-order actors) and runs rank 0's part itself. Steps meet in the
collectives; every rank ends a chunk with the same latents and rank 0 returns them.
Admission counts one rank's footprint (its KV heads, its token shard's camera features and
activations) against rank 0's budget (all ranks hold the same amount). The replica warms up
through all ranks before it is ready.

A rank that dies or stops answering fails the others' collectives after
`model.parallel.launch.DEFAULT_TIMEOUT_S`; `check_health` pings the other ranks so that Serve
replaces a replica that lost one (its placement group and rank actors go with it).
"""
from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import numpy as np
import ray
import torch
from ray import serve
from ray.serve import Application
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deployments.config import AppArgs, ModelArgs, ReplicaArgs, SessionArgs
from deployments.dit import DiTDeployment
from deployments.memory import cap_process
from model.accel import AccelOptions
from model.config import DiTConfig
from model.engines import ChunkOutput, SessionFootprint
from model.factory import load_dit_engine
from model.parallel import SPDiTEngine, init_sp_group, load_sp_dit_engine, rank_device, sp_engine
from model.session import DiTSession, DiTSessionSpec

PLACEMENT_STRATEGY = "STRICT_PACK"  # all ranks of a replica on one node


def sp_placement(replica: ReplicaArgs, parallel: int) -> dict[str, Any]:
    """Serve options that give each replica N bundles of the args' per-rank CPUs and GPUs."""
    bundle = {k: v for k, v in (("CPU", replica.num_cpus), ("GPU", replica.num_gpus)) if v > 0}
    if not bundle:
        raise ValueError("a sequence-parallel DiT needs num_cpus or num_gpus > 0 per rank (bundle)")
    return {"placement_group_bundles": [bundle] * parallel, "placement_group_strategy": PLACEMENT_STRATEGY}


def bind_dit(args: AppArgs, options: dict[str, Any]) -> Application:
    """The graph's DiT node: DiTDeployment, or SPDiTDeployment over `args.dit_parallel` GPUs.

    `options` are the deployment options build_app gives DiTDeployment (replicas, actor
    options, router); the SP replica adds its placement group.
    """
    if args.dit_parallel == 1:
        return DiTDeployment.options(**options).bind(args.model, args.sessions)
    return SPDiTDeployment.options(**options, **sp_placement(args.dit, args.dit_parallel)).bind(
        args.model, args.sessions, args.dit_parallel)


@ray.remote
class SPRank:
    """Rank r >= 1 of an SP replica: sessions by id, driven by rank 0 (an in-order actor)."""

    def __init__(self, rank: int, world: int, init_method: str, model: ModelArgs, options: AccelOptions) -> None:
        device = rank_device(model.device)
        group = init_sp_group(rank, world, init_method, device)
        self._engine = load_sp_dit_engine(model.preset, model.checkpoint, model.dtype, device, group,
                                          model.local_attn_size, model.sink_size, options,
                                          random_weights=model.random_weights)
        self._sessions: dict[str, DiTSession] = {}

    def ping(self) -> None:
        """Liveness (and, the first time, that loading finished)."""

    def open(self, sid: str, spec: DiTSessionSpec) -> None:
        self._sessions[sid] = self._engine.open(spec)

    def step(self, sid: str, y: torch.Tensor, poses: np.ndarray, intrinsics: np.ndarray) -> None:
        self._engine.step(self._sessions[sid], y, poses, intrinsics)

    def close(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            self._engine.close(session)


class SPReplicaEngine:
    """The DiTEngine interface DiTDeployment uses, over all ranks of the replica."""

    def __init__(self, local: SPDiTEngine, ranks: list[ray.actor.ActorHandle]) -> None:
        self._local = local
        self._ranks = ranks
        self._ids: dict[DiTSession, str] = {}  # rank 0's session -> id on the other ranks

    @property
    def cfg(self) -> DiTConfig:
        return self._local.cfg

    @property
    def dit(self) -> torch.nn.Module:
        return self._local.dit

    def kv_frames(self, total_latent_frames: int | None) -> int:
        return self._local.kv_frames(total_latent_frames)

    def session_bytes(self, spec_h: int, spec_w: int, kv_frames: int) -> int:
        return self._local.session_bytes(spec_h, spec_w, kv_frames)

    def footprint(self, height: int, width: int, kv_frames: int,
                  total_latent_frames: int | None) -> SessionFootprint:
        return self._local.footprint(height, width, kv_frames, total_latent_frames)

    def open(self, spec: DiTSessionSpec) -> DiTSession:
        session = self._local.open(spec)  # no collectives: rank 0 first, so a bad spec stops here
        sid = uuid.uuid4().hex
        ray.get([r.open.remote(sid, spec) for r in self._ranks])
        self._ids[session] = sid
        return session

    def step(self, session: DiTSession, y: torch.Tensor, poses: np.ndarray,
             intrinsics: np.ndarray) -> ChunkOutput:
        sid = self._ids[session]
        others = [r.step.remote(sid, y, poses, intrinsics) for r in self._ranks]  # meet in the collectives
        out = self._local.step(session, y, poses, intrinsics)
        ray.get(others)
        return out

    def close(self, session: DiTSession) -> None:
        sid = self._ids.pop(session, None)
        self._local.close(session)
        if sid is not None:
            ray.get([r.close.remote(sid) for r in self._ranks])

    async def ping(self) -> None:
        await asyncio.gather(*(r.ping.remote() for r in self._ranks))


def _rendezvous() -> str:
    """A TCP rendezvous address on this node (a port free now; the group binds it at once)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"


@serve.deployment(name="DiTDeployment")
class SPDiTDeployment(DiTDeployment.func_or_class):
    """DiTDeployment over the N GPUs of its placement group (rank 0 here, ranks 1..N-1 actors)."""

    async def __init__(self, model: ModelArgs, sessions: SessionArgs, parallel: int) -> None:
        pg = get_current_placement_group()
        if parallel < 2 or pg is None or len(pg.bundle_specs) != parallel:
            raise ValueError(f"SPDiTDeployment over {parallel} ranks needs a placement group of {parallel} "
                             "bundles (deploy it through sp_dit.bind_dit)")
        device = rank_device(model.device)
        options = AccelOptions.for_serving(device, compile=model.compile, fp8=model.fp8)
        init_method = _rendezvous()
        ranks = [
            SPRank.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
                num_cpus=pg.bundle_specs[r].get("CPU", 0), num_gpus=pg.bundle_specs[r].get("GPU", 0),
            ).remote(r, parallel, init_method, model, options)
            for r in range(1, parallel)
        ]
        group = await asyncio.to_thread(init_sp_group, 0, parallel, init_method, device)
        cap = cap_process(model.device, sessions.memory_fraction)
        base = load_dit_engine(model.preset, model.checkpoint, model.dtype, str(device),
                               local_attn_size=model.local_attn_size, sink_size=model.sink_size,
                               options=options, random_weights=model.random_weights)  # rank 0's DiT
        self._engine = SPReplicaEngine(sp_engine(base, group, options), ranks)
        await self._engine.ping()  # the other ranks have loaded
        await self._ready(model, sessions, cap)  # warm-up over all ranks, budget, session table, host
        self._log.info("sequence-parallel replica ready", fields={"ranks": parallel, "device": str(device)})

    async def check_health(self) -> None:
        await self._engine.ping()
