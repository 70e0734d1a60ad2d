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


async def _turn(lock: PriorityLock, name: str, log: list[str], priority: int, owner, hold_s: float = 0.01) -> None:
    async with lock.hold(priority, owner):
        log.append(name)
        await asyncio.sleep(hold_s)


def test_urgent_before_live_before_offline_whatever_the_arrival_order():
    """Issue 46: a job's chunk (offline) runs only while no live chunk waits; closes first."""
    from deployments.replicas.priority_lock import LIVE, OFFLINE, URGENT  # noqa: PLC0415

    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_turn(lock, "running", log, OFFLINE, "job", hold_s=0.05))
        await asyncio.sleep(0)
        order = [("job1", OFFLINE, "job"), ("job2", OFFLINE, "job2"), ("live1", LIVE, "a"), ("close", URGENT, None),
                 ("live2", LIVE, "b")]
        tasks = []
        for name, priority, owner in order:
            tasks.append(asyncio.create_task(_turn(lock, name, log, priority, owner)))
            await asyncio.sleep(0)
        await asyncio.gather(running, *tasks)
        assert not lock.locked() and lock.waiting == 0
        return log

    assert asyncio.run(go()) == ["running", "close", "live1", "live2", "job2", "job1"]


def test_round_robin_among_the_live_by_the_owner_served_least_recently():
    """Session a has two chunks queued, b one: b's goes between a's two (a just had a turn),
    and a session that just ran waits while another of its class has one waiting."""
    from deployments.replicas.priority_lock import LIVE  # noqa: PLC0415

    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_turn(lock, "a0", log, LIVE, "a", hold_s=0.05))
        await asyncio.sleep(0)
        tasks = []
        for name, owner in (("a1", "a"), ("a2", "a"), ("b0", "b")):
            tasks.append(asyncio.create_task(_turn(lock, name, log, LIVE, owner)))
            await asyncio.sleep(0)
        await asyncio.gather(running, *tasks)
        return log

    assert asyncio.run(go()) == ["a0", "b0", "a1", "a2"]


def test_round_robin_is_per_turn_with_three_owners():
    from deployments.replicas.priority_lock import OFFLINE  # noqa: PLC0415

    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_turn(lock, "x", log, OFFLINE, "x", hold_s=0.05))
        await asyncio.sleep(0)
        tasks = []
        for name in ("a1", "a2", "a3", "b1", "b2", "c1"):
            tasks.append(asyncio.create_task(_turn(lock, name, log, OFFLINE, name[0])))
            await asyncio.sleep(0)
        await asyncio.gather(running, *tasks)
        return log

    assert asyncio.run(go()) == ["x", "a1", "b1", "c1", "a2", "b2", "a3"]


def test_a_cancelled_live_waiter_hands_the_lock_to_the_offline_one():
    """Cancelled while queued, or right as the lock was handed to it: never held, never leaked."""
    from deployments.replicas.priority_lock import LIVE, OFFLINE  # noqa: PLC0415

    async def go() -> list[str]:
        lock, log = PriorityLock(), []
        running = asyncio.create_task(_turn(lock, "running", log, LIVE, "a", hold_s=0.05))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_turn(lock, "gone", log, LIVE, "b"))
        job = asyncio.create_task(_turn(lock, "job", log, OFFLINE, "j"))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.gather(running, gone, job, return_exceptions=True)
        async with lock.hold(LIVE, "a"):
            late = asyncio.create_task(_turn(lock, "late", log, LIVE, "b"))
            job2 = asyncio.create_task(_turn(lock, "job2", log, OFFLINE, "j"))
            await asyncio.sleep(0)
        late.cancel()  # the release handed it the lock; the cancel lands before it runs
        await asyncio.gather(late, job2, return_exceptions=True)
        assert not lock.locked() and lock.waiting == 0 and not lock._waiters
        return log

    assert asyncio.run(go()) == ["running", "job", "job2"]
