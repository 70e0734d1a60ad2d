"""SessionHost._compute_on_early: a job's result is returned when it publishes it, while its
follow-up work holds the replica's lock; a failure after publishing drops the session; the
caller's cancellation does not cancel the job. (DiTDeployment publishes a chunk's latents
before its cache-update call.)"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from deployments.errors import SessionLost
from deployments.replicas.priority_lock import PriorityLock
from deployments.replicas.session_host import SessionHost
from deployments.replicas.session_table import SessionTable


def _host() -> SessionHost:
    host = object.__new__(SessionHost)
    host._device = "cpu"
    host._table = SessionTable(8, None, idle_ttl_s=60.0, retry_after_s=1.0)
    host._lock = PriorityLock()
    host._jobs = set()
    host.released = []
    host._release = lambda state: host.released.append(state)
    host._log = type("L", (), {"info": staticmethod(lambda *a, **k: None),
                               "error": staticmethod(lambda *a, **k: None)})()
    host._publish = lambda: None
    for key in ("a", "b"):
        host._table.admit(key, 1)
        host._table.start_building(key)
        host._table.add(key, key)
    return host


def test_the_result_comes_before_the_follow_up_which_still_holds_the_lock():
    order: list[str] = []
    follow_up_done = threading.Event()

    def job(state, publish, value):
        order.append(f"{state} compute")
        publish(value * 2)
        time.sleep(0.1)  # the follow-up (a cache update)
        order.append(f"{state} follow-up")
        follow_up_done.set()
        return value * 2

    def other(state):
        order.append(f"{state} next job")

    async def go():
        host = _host()
        t0 = time.perf_counter()
        result = await host._compute_on_early("a", job, 21)
        early_s = time.perf_counter() - t0
        assert host._lock.locked() and not follow_up_done.is_set()
        await host._compute_on("b", other)  # waits for the follow-up
        return result, early_s

    result, early_s = asyncio.run(go())
    assert result == 42 and early_s < 0.09
    assert order == ["a compute", "a follow-up", "b next job"]


def test_a_failure_before_publishing_is_the_callers_and_after_it_drops_the_session():
    def fails_early(state, publish):
        raise RuntimeError("boom")

    def fails_late(state, publish):
        publish("ok")
        time.sleep(0.02)
        raise RuntimeError("late boom")

    async def go():
        host = _host()
        with pytest.raises(RuntimeError, match="boom"):
            await host._compute_on_early("a", fails_early)
        assert "a" in host._table.keys()
        assert await host._compute_on_early("b", fails_late) == "ok"
        for _ in range(100):
            if "b" not in host._table.keys() and not host._jobs:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(SessionLost):
            await host._compute_on("b", lambda state: None)
        return host

    host = asyncio.run(go())
    assert host.released == ["b"]


def test_a_cancelled_caller_leaves_the_job_running():
    finished = threading.Event()

    def job(state, publish):
        time.sleep(0.1)
        publish("late")
        finished.set()

    async def go():
        host = _host()
        caller = asyncio.create_task(host._compute_on_early("a", job))
        await asyncio.sleep(0.02)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await host._compute_on("b", lambda state: None)  # queued behind the job, which completes
        return host

    host = asyncio.run(go())
    assert finished.is_set() and not host._lock.locked()
