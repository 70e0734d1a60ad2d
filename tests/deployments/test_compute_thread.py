"""A replica's model work runs on one thread (deployments/replicas/compute_thread.py): PyTorch keeps
cuDNN's autotuned plans per thread, so a call on a thread new to a conv shape autotunes again
(a 0.27 s decode ran 1.6-2.2 s on the H200 when calls moved between the shared pool's threads)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from deployments.replicas.compute_thread import ComputeThread
from session_host_stub import stub_host as _host


def _ident(*_args) -> int:
    time.sleep(0.01)
    return threading.get_ident()


def test_every_job_runs_on_the_same_thread_while_the_shared_pool_grows():
    thread = ComputeThread("test")

    async def go():
        noise = [asyncio.to_thread(time.sleep, 0.05) for _ in range(8)]  # the default pool's threads
        jobs = [thread.run(_ident) for _ in range(12)]
        results = await asyncio.gather(*jobs, *noise)
        return results[:12]

    idents = asyncio.run(go())
    assert len(set(idents)) == 1 and idents[0] != threading.get_ident()
    thread.shutdown()


def test_a_host_runs_warm_up_builds_calls_and_releases_on_its_compute_thread():
    host = _host(slow_call_s=10.0)
    seen: list[int] = []
    host._release = lambda state: seen.append(threading.get_ident())

    async def go():
        warm = await host.compute_thread.run(_ident)  # what DiT/VaeDeployment do before _start_host
        calls = await asyncio.gather(*(host._compute_on(key, _ident) for key in ("a", "b", "a", "b")))
        whole = await host._compute(_ident)
        await host.close("a")
        return [warm, *calls, whole]

    idents = asyncio.run(go())
    assert len(set(idents + seen)) == 1 and len(seen) == 1


def test_a_cancelled_caller_waits_for_its_job_to_end():
    thread = ComputeThread("test")
    finished = threading.Event()

    def work() -> None:
        time.sleep(0.2)
        finished.set()

    async def go():
        task = asyncio.ensure_future(thread.run(work))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return finished.is_set()

    assert asyncio.run(go())  # the job had ended when the cancellation reached the caller
    thread.shutdown()


def test_keyword_arguments_reach_the_job():
    """VaeDeployment's warm-up passes its muxer factory by keyword (`consumer=`)."""
    thread = ComputeThread("test")

    def job(a: int, *, consumer) -> tuple[int, str, int]:
        return a, consumer(), threading.get_ident()

    a, made, ident = asyncio.run(thread.run(job, 3, consumer=lambda: "muxer"))
    assert (a, made) == (3, "muxer") and ident != threading.get_ident()
    thread.shutdown()


def test_a_synchronous_call_runs_on_the_thread_too():
    """TextEncoderDeployment's constructor warms up with `call`, its encodes use `run`."""
    thread = ComputeThread("test")
    warm = thread.call(_ident)
    assert warm != threading.get_ident() and asyncio.run(thread.run(_ident)) == warm
    thread.shutdown()
