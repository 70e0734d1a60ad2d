"""A replica's model calls are one `calls` INFO line per interval (their access-log lines are DEBUG)."""
from __future__ import annotations

import logging

from deployments.log import get_log
from deployments.replicas.call_summary import CallSummary


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ray.serve.lwf.dit"]


def test_a_minute_of_calls_is_one_line_with_counts_and_run_times(caplog):
    clock = Clock()
    summary = CallSummary(get_log("dit", replica="r1"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.dit"):
        for i in range(100):  # two sessions' chunks: a step and a finish_chunk each, every 1.2 s
            summary.add(f"s{i % 2}", "step", 0.5 + 0.001 * i)
            summary.add(f"s{i % 2}", "finish_chunk", 0.25)
            clock.now += 0.5
        assert _lines(caplog) == []  # 50 s: within the interval
        clock.now += 10.0
        summary.flush()  # the replica's periodic flush
        summary.flush()  # nothing pending: nothing more
    (line,) = _lines(caplog)
    assert line.levelno == logging.INFO
    text = line.getMessage()
    assert text.startswith("calls ")
    for part in ("over_s=60.0", "count=200", "calls=finish_chunk:100,step:100", "run_s=finish_chunk:25.00,step:54.95",
                 "sessions=2", "max_run_s=0.599", "max_run_call=step", "replica=r1"):
        assert part in text, text
    assert summary.pending == 0


def test_calls_past_the_interval_are_logged_as_they_come_and_a_quiet_replica_logs_nothing(caplog):
    clock = Clock()
    summary = CallSummary(get_log("dit"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.dit"):
        clock.now += 120.0
        summary.flush()  # no call in two minutes: no line
        assert _lines(caplog) == []
        summary.add("s", "step", 1.0)
        assert _lines(caplog) == []  # the flush above started a new interval
        clock.now += 61.0
        summary.add("s", "step", 1.0)  # the call that ends the interval is counted in its line
    (line,) = _lines(caplog)
    assert "count=2" in line.getMessage() and "over_s=61.0" in line.getMessage()
