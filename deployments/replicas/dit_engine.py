"""The engine a DiTDeployment replica serves with, and how it knows the engine still computes.

One device: the DiT loaded in the replica's process (`load_dit_engine`). N devices
(`dit_parallel` > 1): `SPReplicaEngine` over the replica's ranks (deployments/replicas/sp_dit.py),
rank 0 in this process. The deployment holds either the same way (gpt-fast's `tp.py`: the
parallelism is a part around the unchanged model, not a subclass of the serving object); only
the `EngineHealth` differs: a device probe, or the ranks' liveness (a broken SP replica
refuses new sessions and loses its sessions at once).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from deployments.config import ModelArgs, SessionArgs
from deployments.replicas.engine_options import engine_options
from deployments.replicas.memory import cap_process
from deployments.replicas.session_host import device_probe
from deployments.replicas.sp_dit import start_sp_engine
from model.dit.caches import KVCacheConfig
from model.engine_api import DiTEngineProtocol
from model.factory import load_dit_engine


class EngineHealth(Protocol):
    @property
    def broken(self) -> Optional[str]:
        """Why the engine can compute no more (for good), or None."""

    async def check(self) -> None:
        """Serve's health check: raises when the engine cannot compute."""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """A one-device engine: it breaks only with its device, which a tiny op probes."""

    device: str
    broken: Optional[str] = None

    async def check(self) -> None:
        await asyncio.to_thread(device_probe, self.device)


@dataclass(frozen=True, slots=True)
class ServingEngine:
    engine: DiTEngineProtocol
    health: EngineHealth
    cap: int  # the process's memory cap, set before the engine allocated anything
    info: dict[str, Any] = field(default_factory=dict)  # added to the replica's stats (an SP replica's ranks)


async def start_engine(model: ModelArgs, sessions: SessionArgs, parallel: int, timeout_s: float) -> ServingEngine:
    """The replica's engine on its one device, or over `parallel` ranks (its placement group)."""
    if parallel > 1:
        engine, cap = await start_sp_engine(model, sessions, parallel, timeout_s)
        return ServingEngine(engine, engine, cap, {"ranks": engine.rank_names})
    cap = cap_process(model.device, sessions.memory_fraction)  # before anything is allocated
    engine = load_dit_engine(**engine_options(model, model.device),
                             kv=KVCacheConfig.for_serving(model.device, model.kv_cache, model.fp8_attention))
    return ServingEngine(engine, DeviceHealth(model.device), cap)
