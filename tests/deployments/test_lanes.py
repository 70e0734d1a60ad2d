"""Lane: one job at a time, in submission order; failures stay with their job; stop cancels."""
from __future__ import annotations

import asyncio

import pytest

from deployments.lanes import Lane


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
        await lane.stop()
        return results, log

    results, log = asyncio.run(go())
    assert results == [0, 10, 20, 30]
    assert log == [0, 1, 2, 3]


def test_a_failing_job_fails_only_its_future_and_stop_cancels_the_rest():
    async def go():
        lane = Lane("t")

        async def boom():
            raise KeyError("x")

        async def ok():
            return "ok"

        async def forever():
            await asyncio.Event().wait()

        bad, good = lane.submit(boom), lane.submit(ok)
        with pytest.raises(KeyError):
            await bad
        assert await good == "ok"
        stuck, queued = lane.submit(forever), lane.submit(ok)
        await asyncio.sleep(0.01)
        await lane.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            lane.submit(ok)
        return stuck.cancelled(), queued.cancelled()

    assert asyncio.run(go()) == (True, True)
