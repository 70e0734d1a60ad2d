"""Issue 46 on the replicas, without Ray: live sessions' calls before offline ones' (round
robin among each class), the offline bound apart from the live slots, and the frame-rate floor
(`sessions.min_fps`) from the replica's measured step times."""
from __future__ import annotations

import asyncio
import pickle
import time
from types import SimpleNamespace

import numpy as np
import pytest

from deployments.errors import Busy
from deployments.replicas.dit import DiTDeployment
from deployments.replicas.frame_floor import FrameFloor
from deployments.replicas.priority_lock import PriorityLock
from deployments.replicas.session_table import SessionTable
from deployments.wire import SessionOptions
from model.engine_api import EngineCapabilities, SessionFootprint
from session_host_stub import stub_host

BUCKET = (32, 48, False)  # (height, width, windowed) of the sessions below


def test_a_jobs_chunks_never_run_while_a_live_chunk_waits():
    """A job's chunk running, then two more of it, two of live session a and one of b queued:
    the live ones first, a and b in turn (a just had one: b goes between a's two), then the job."""
    host = stub_host(slow_call_s=100.0)
    host._table.admit("job", 1, offline=True)
    host._table.start_building("job")
    host._table.add("job", "job")
    order: list[str] = []

    def step(state: str, name: str) -> None:
        time.sleep(0.01)
        order.append(name)

    async def go() -> None:
        running = asyncio.create_task(host._compute_on("job", step, "job0"))
        await asyncio.sleep(0.005)  # it holds the lock
        queued = []
        for key, name in (("job", "job1"), ("a", "a0"), ("job", "job2"), ("a", "a1"), ("b", "b0")):
            queued.append(asyncio.create_task(host._compute_on(key, step, name)))
            await asyncio.sleep(0)
        await asyncio.gather(running, *queued)

    asyncio.run(go())
    assert order == ["job0", "a0", "b0", "a1", "job1", "job2"]


class FakeEngine:
    """What the DiT's admission asks of its engine (no model)."""

    cfg = SimpleNamespace(local_attn_size=-1)
    capabilities = EngineCapabilities()

    @staticmethod
    def footprint(height, width, kv_frames, total_latent_frames) -> SessionFootprint:
        return SessionFootprint(100, 10)

    @staticmethod
    def kv_frames(total_latent_frames, full_attention=False) -> int:
        return total_latent_frames or 3

    def session_cfg(self, full_attention: bool):
        return self.cfg

    @staticmethod
    def open(spec):
        return SimpleNamespace(spec=spec)

    @staticmethod
    def replay(session, spec, chunks, noise) -> None:
        pass


class _Counter:
    def inc(self, *a, **k) -> None:
        pass


def dit(max_sessions: int = 4, max_offline: int = 1, min_fps: float = 0.0):
    """A DiTDeployment's admission state (no Serve, no model)."""
    host = object.__new__(DiTDeployment.func_or_class)
    host._engine = FakeEngine()
    host._max_chunks, host._max_attention_tokens = 10, 10**9
    host._table = SessionTable(max_sessions, None, idle_ttl_s=60.0, retry_after_s=2.0,
                               max_offline_sessions=max_offline)
    host._floor = FrameFloor(min_fps)
    host._lock = PriorityLock()
    host._health = SimpleNamespace(broken=None)
    host._replica, host._device, host._refused_total = "r1", "cpu", 0
    host._metrics = SimpleNamespace(rejected=_Counter(), admitted=_Counter(), update=lambda *a: None,
                                    observe_call=lambda *a: None)
    host._log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    return host


def options(offline: bool = False) -> SessionOptions:
    return SessionOptions("s", "p", "d", (32, 48), 1, 6, None, (480, 832), offline=offline)


def reserve(host, key: str, offline: bool = False) -> None:
    asyncio.run(host.reserve(key, options(offline)))


def test_offline_sessions_have_their_own_bound_beside_the_live_slots():
    host = dit(max_sessions=1, max_offline=1)
    reserve(host, "job", offline=True)
    reserve(host, "live")  # the job took no live slot
    with pytest.raises(Busy, match="max_offline_sessions"):
        reserve(host, "job2", offline=True)  # its own bound, whatever the live slots
    with pytest.raises(Busy, match="all 1 session slots"):
        reserve(host, "live2")
    assert host._table.held_by_class() == (1, 1) and host._refused_total == 2
    stats = host.record_routing_stats()  # the router places live sessions and jobs by their own slots
    assert (stats["capacity"], stats["offline_capacity"], stats["apart"]) == (1, 1, ["job"])
    assert sorted(stats["keys"]) == ["job", "live"]


def test_the_floor_refuses_a_live_session_from_the_measured_step_times():
    """min_fps 4: one chunk (12 frames) per session every 3 s at most. Steps measured at 1 s:
    three live sessions fit (12 / 3 s = 4 frames/s), a fourth does not; a job still does."""
    host = dit(max_sessions=8, max_offline=2, min_fps=4.0)
    reserve(host, "a")
    reserve(host, "b")  # nothing measured yet: slots and bytes only
    host._record_call("a", host._step, 0.0, 1.0)  # a step of a's size ran 1 s (the floor's measure)
    assert host._floor.step_s(BUCKET) == 1.0
    reserve(host, "c")  # 3 live sessions: a chunk each every 3 s, 4 frames/s
    with pytest.raises(Busy, match=r"sessions\.min_fps") as refused:
        reserve(host, "d")  # 4 s: 3 frames/s
    assert refused.value.retry_after_s == 2.0 and "3.0" in refused.value.message
    assert refused.value.ends_needed == 1  # 3 of 4 fit: one of the live sessions must end
    host._record_call("a", host._step, 0.0, 2.4)  # slower steps measured (mean 1.42 s): 2 of 4 fit
    with pytest.raises(Busy) as refused:
        reserve(host, "d")
    assert refused.value.ends_needed == 2  # what the waiting room's ETAs take (line/book.py)
    crossed = pickle.loads(pickle.dumps(refused.value))  # as Ray carries it to the ingress
    assert (crossed.ends_needed, crossed.retry_after_s, crossed.message) == (2, 2.0, refused.value.message)
    host._floor._step_s[BUCKET] = 1.0  # back at 1 s for the rest
    reserve(host, "job", offline=True)  # offline: neither in the cycle nor held to the floor
    host._record_call("b", host._step, 0.0, 0.1)  # a faster step measured since (mean 0.73 s): room again
    reserve(host, "d")


def test_without_the_floor_or_alone_a_session_is_admitted_however_slow_the_steps():
    off = dit(min_fps=0.0)
    off._floor.observe(BUCKET, 100.0)
    for key in ("a", "b", "c"):
        reserve(off, key)
    alone = dit(min_fps=30.0)
    alone._floor.observe(BUCKET, 100.0)
    reserve(alone, "a")  # nobody else to protect: refusing it would serve nobody
    with pytest.raises(Busy, match="min_fps"):
        reserve(alone, "b")


def test_a_rebuild_after_a_replica_loss_is_not_refused_by_the_floor():
    """`restore` without a reservation (Recovery) is a session already admitted: slots and bytes only."""
    host = dit(min_fps=30.0)
    host._floor.observe(BUCKET, 100.0)
    reserve(host, "a")
    context = np.zeros((4, 8), np.float32)
    assert asyncio.run(host.restore("rebuilt", options(), context, [], None)) == "r1"
    assert sorted(host._table.keys()) == ["a", "rebuilt"]
