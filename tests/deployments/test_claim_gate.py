"""ClaimGate (deployments/ingress/guards/claim_gate.py): failed resume claims cost their client, not others."""
from __future__ import annotations

from deployments.ingress.guards.claim_gate import MAX_WAIT_S, ClaimGate


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_passes_then_claims_wait_their_turn_then_are_refused():
    clock = Clock()
    gate = ClaimGate(clock)
    rate, burst = 12.0, 3  # one claim every 5 s after 3
    assert [gate.take("addr:a", rate, burst) for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [gate.take("addr:a", rate, burst) for _ in range(6)]
    assert waits == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]  # each waiting claim behind the previous one
    assert gate.take("addr:a", rate, burst) is None  # over MAX_WAIT_S: not made, nothing taken
    assert gate.retry_in("addr:a", rate, burst) == 5.0
    assert gate.take("addr:b", rate, burst) == 0.0  # another client is not charged
    clock.t += 5.0
    assert gate.take("addr:a", rate, burst) == MAX_WAIT_S  # refilled by one


def test_successful_claims_cost_nothing():
    gate = ClaimGate(Clock())
    for _ in range(20):
        assert gate.take("key:k", 12.0, 2) == 0.0
        gate.give_back("key:k", 2)


def test_the_buckets_are_bounded():
    from deployments.ingress.guards import claim_gate

    gate = ClaimGate(Clock())
    for i in range(claim_gate.MAX_CLIENTS + 10):
        gate.take(f"addr:{i}", 12.0, 2)
    assert len(gate) == claim_gate.MAX_CLIENTS
