"""deployments/replicas/priority_lock.py: urgent waiters first, FIFO within a class, safe cancellation;
and SessionHost's close overtakes queued chunks of other sessions."""
from __future__ import annotations

import asyncio

import pytest

from deployments.replicas.priority_lock import PriorityLock


async def _job(lock: PriorityLock, name: str, log: list[str], urgent: bool = False, hold_s: float = 0.01) -> None:
    async with (lock.urgent() if urgent else lock):
        log.append(name)
        await asyncio.sleep(hold_s)


def test_urgent_waiters_overtake_normal_ones_in_arrival_order():
    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_job(lock, "running", log, hold_s=0.05))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(_job(lock, n, log, urgent=n.startswith("u"))) for n in ("n1", "n2", "u1", "n3", "u2")]
        await asyncio.gather(running, *tasks)
        assert not lock.locked() and lock.waiting == 0
        return log

    assert asyncio.run(go()) == ["running", "u1", "u2", "n1", "n2", "n3"]


def test_a_cancelled_waiter_never_holds_or_leaks_the_lock():
    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_job(lock, "running", log, hold_s=0.05))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_job(lock, "gone", log, urgent=True))
        after = asyncio.create_task(_job(lock, "after", log))
        await asyncio.sleep(0.01)
        gone.cancel()  # cancelled while waiting
        await asyncio.gather(running, after, gone, return_exceptions=True)
        # cancelled right as the lock is handed to it: it passes the lock on
        async with lock:
            late = asyncio.create_task(_job(lock, "late", log))
            last = asyncio.create_task(_job(lock, "last", log))
            await asyncio.sleep(0)
        late.cancel()  # the release above resolved its future; the cancel lands before it runs
        await asyncio.gather(late, last, return_exceptions=True)
        assert not lock.locked()
        return log

    assert asyncio.run(go()) == ["running", "after", "last"]


def test_release_of_an_unlocked_lock_is_an_error():
    with pytest.raises(RuntimeError):
        PriorityLock().release()


def test_a_close_overtakes_the_chunks_queued_on_the_replica():
    """A SessionHost with 3 chunk steps of other sessions queued: the close of a session runs
    right after the step running (before: after all of them), and its memory is released."""
    from deployments.replicas.session_host import SessionHost
    from deployments.replicas.session_table import SessionTable

    async def go() -> list[str]:
        host = object.__new__(SessionHost)
        host._device = "cpu"
        order: list[str] = []
        host._table = SessionTable(8, None, idle_ttl_s=60.0, retry_after_s=1.0)
        host._lock = PriorityLock()
        host._release = lambda state: order.append(f"release {state}")
        host._log = type("L", (), {"info": staticmethod(lambda *a, **k: None)})()
        host._publish = lambda: None
        for key in ("a", "b", "c", "d"):
            host._table.admit(key, 1)
            host._table.start_building(key)
            host._table.add(key, key)

        def step(state: str) -> None:
            import time
            time.sleep(0.05)
            order.append(f"step {state}")

        steps = [asyncio.create_task(host._compute_on(k, step)) for k in ("a", "b", "c")]
        await asyncio.sleep(0.01)
        closed = await host.close("d")
        await asyncio.gather(*steps)
        assert closed and "d" not in host._table.keys()
        return order

    assert asyncio.run(go()) == ["step a", "release d", "step b", "step c"]
