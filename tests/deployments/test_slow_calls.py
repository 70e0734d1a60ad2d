"""Slow calls are one summary line per interval, not one WARNING per call (issue 36)."""
from __future__ import annotations

import logging

from deployments.log import get_log
from deployments.replicas.slow_calls import SlowCalls


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ray.serve.lwf.vae"]


def test_ninety_slow_calls_in_a_minute_are_two_lines(caplog):
    clock = Clock()
    slow = SlowCalls(get_log("vae", replica="r1"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.vae"):
        for i in range(90):  # a session's worth of "slow" CPU VAE calls, one every 0.6 s
            slow.add(f"s{i % 2}", "decode" if i % 2 else "condition", 0.01 * i, 1.0 + 0.01 * i,
                     {"compiled_graphs": 1} if i == 5 else {})
            clock.now += 0.6
        first = _lines(caplog)
        assert len(first) == 1  # the first slow call at once, then nothing within the interval
        assert first[0].startswith("slow calls ") and " count=1 " in first[0] and "calls=condition:1" in first[0]
        clock.now += 10.0
        slow.flush()  # the replica's periodic flush, past the interval: the other 89 in one line
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    summary = lines[1]
    for part in ("count=89", "calls=condition:44,decode:45", "sessions=2", "max_run_s=1.89",
                 "max_run_call=decode", "max_run_session=s1", "max_wait_s=0.89", "compiled_graphs=1",
                 "replica=r1"):
        assert part in summary, summary
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "ray.serve.lwf.vae")


def test_a_flush_with_nothing_pending_or_within_the_interval_logs_nothing(caplog):
    clock = Clock()
    slow = SlowCalls(get_log("vae"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.vae"):
        slow.flush()
        slow.add("s", "decode", 0.0, 2.0, {})
        slow.add("s", "decode", 0.0, 2.0, {})
        clock.now += 30.0
        slow.flush()
        assert len(_lines(caplog)) == 1 and slow.pending == 1
        clock.now += 30.0
        slow.flush()
    assert len(_lines(caplog)) == 2 and slow.pending == 0
