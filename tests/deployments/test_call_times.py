"""SessionHost records each model call's wait for the compute lock and its run time (metrics),
and counts a slow call with both in its `slow calls` summary line (how a stall inside a
replica shows, apart from queueing; deployments/replicas/slow_calls.py)."""
from __future__ import annotations

import asyncio
import time

from session_host_stub import stub_host as _host


def _decode(state: str, seconds: float) -> str:
    time.sleep(seconds)
    return state


def _fails(state: str) -> None:
    raise RuntimeError("boom")


def test_wait_and_run_times_per_call_and_a_slow_call_logged():
    host = _host(slow_call_s=0.15)

    async def go():
        return await asyncio.gather(host._compute_on("a", _decode, 0.2), host._compute_on("b", _decode, 0.01))

    assert asyncio.run(go()) == ["a", "b"]
    (name_a, wait_a, run_a), (name_b, wait_b, run_b) = host._metrics.calls
    assert name_a == name_b == "decode"
    assert run_a >= 0.2 and wait_a < 0.05  # a ran first
    assert wait_b >= 0.19 and run_b < 0.15  # b waited for a's run, then ran briefly
    [(msg, fields)] = host._log.warnings  # the first slow call is logged at once
    assert msg == "slow calls"
    assert fields["count"] == 1 and fields["calls"] == "decode:1" and fields["max_run_session"] == "a"
    assert fields["max_run_s"] == round(run_a, 3) and fields["max_wait_s"] == round(wait_a, 3)


def test_a_failing_call_is_recorded_too():
    host = _host(slow_call_s=10.0)
    try:
        asyncio.run(host._compute_on("a", _fails))
    except RuntimeError:
        pass
    assert [c[0] for c in host._metrics.calls] == ["fails"] and host._log.warnings == []


def _compiles(state: str, seconds: float) -> str:
    import torch

    fn = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    fn(torch.ones(3, 5, 7))  # a graph no earlier call built
    time.sleep(seconds)
    return state


def test_a_slow_call_that_compiled_says_so():
    host = _host(slow_call_s=0.1)
    assert asyncio.run(host._compute_on("a", _compiles, 0.15)) == "a"
    assert asyncio.run(host._compute_on("b", _decode, 0.15)) == "b"
    host.slow_calls.flush(force=True)  # b came within the interval of a's line: pending until now
    (msg_a, fields_a), (msg_b, fields_b) = host._log.warnings
    assert msg_a == msg_b == "slow calls"
    assert fields_a["compiled_graphs"] == 1 and fields_a["max_run_call"] == "compiles"
    assert "compiled_graphs" not in fields_b  # nothing moved during b: only the times
    assert fields_b["calls"] == "decode:1" and fields_b["count"] == 1
