"""Lane: one job at a time, in submission order; failures stay with their job; drain drops
what has not started and never cancels the running job; jobs run outside the caller's context."""
from __future__ import annotations

import asyncio
import contextvars

import pytest

from deployments.ingress.lanes import Lane


def test_jobs_run_one_at_a_time_in_submission_order():
    async def go():
        lane = Lane("t")
        running, log = [], []

        def job(i: int, delay: float):
            async def run():
                running.append(i)
                assert len(running) == 1, "two jobs of one lane overlapped"
                await asyncio.sleep(delay)
                log.append(i)
                running.remove(i)
                return i * 10
            return run

        futs = [lane.submit(job(i, d)) for i, d in enumerate([0.03, 0.0, 0.02, 0.0])]
        results = await asyncio.gather(*futs)
        assert await lane.drain(1.0)
        return results, log

    results, log = asyncio.run(go())
    assert results == [0, 10, 20, 30]
    assert log == [0, 1, 2, 3]


def test_a_failing_job_fails_only_its_future():
    async def go():
        lane = Lane("t")

        async def boom():
            raise KeyError("x")

        async def ok():
            return "ok"

        bad, good = lane.submit(boom), lane.submit(ok)
        with pytest.raises(KeyError):
            await bad
        assert await good == "ok"
        assert await lane.drain(1.0)

    asyncio.run(go())


def test_drain_drops_queued_jobs_and_lets_the_running_one_finish_uncancelled():
    async def go():
        lane = Lane("t")
        release = asyncio.Event()
        seen = []

        async def running_call():
            try:
                await release.wait()  # a Serve call on its way
                seen.append("finished")
                return "done"
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        async def never():
            seen.append("queued job ran")

        first, queued = lane.submit(running_call), lane.submit(never)
        await asyncio.sleep(0.01)
        assert not await lane.drain(0.05)  # the running job is still running at the deadline
        assert queued.cancelled() and not first.done()
        assert lane.submit(never).cancelled()  # a draining lane takes nothing new
        release.set()
        assert await lane.drain(1.0)  # ... and ends once the running job has
        return await first, seen

    result, seen = asyncio.run(go())
    assert result == "done" and seen == ["finished"]


def test_a_job_that_awaits_a_cancelled_future_is_cancelled_alone():
    async def go():
        lane = Lane("t")
        upstream = asyncio.get_running_loop().create_future()

        async def waits():
            return await upstream

        async def after():
            return "next"

        a, b = lane.submit(waits), lane.submit(after)
        upstream.cancel()
        assert await b == "next"  # the worker survived
        return a.cancelled()

    assert asyncio.run(go())


def test_jobs_run_in_a_fresh_context_not_the_callers():
    request = contextvars.ContextVar("request", default=None)

    async def go():
        request.set("websocket-request-1")  # what Serve's request context is to a handler
        lane = Lane("t")

        async def job():
            return request.get()

        result = await lane.submit(job)
        await lane.drain(1.0)
        return result

    assert asyncio.run(go()) is None
