"""deployments/replicas/stall_counters.py: the counters a slow call's log line reports, on the CPU."""
from __future__ import annotations

import torch

from deployments.replicas import stall_counters


def test_a_compile_moves_the_compiled_graphs_counter_and_nothing_else():
    before = stall_counters.snapshot("cpu")
    assert set(before) == {"compiled_graphs"}  # no CUDA counters on a CPU replica
    torch.compile(lambda x: x.sin() + 3, backend="eager", dynamic=False)(torch.ones(2, 11))
    after = stall_counters.snapshot("cpu")
    assert stall_counters.moved(before, after) == {"compiled_graphs": 1}
    assert stall_counters.moved(after, stall_counters.snapshot("cpu")) == {}


def test_moved_reports_increases_and_new_counters():
    assert stall_counters.moved({"a": 1, "b": 2}, {"a": 1, "b": 5, "c": 4}) == {"b": 3, "c": 4}
