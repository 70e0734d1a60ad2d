"""SessionTable, issue 31: admission ahead of the open (a reservation made before any work,
claimed by the open, expiring when the open never comes) and a `retry_after_s` counted from
when the slots are expected to free (a parked session's grace end), not a constant."""
from __future__ import annotations

import pytest

from deployments.errors import Busy, SessionLost, TooLarge
from deployments.replicas.session_table import SessionTable

RETRY_AFTER_S = 2.0  # the poll interval: a slot whose end is unknown


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(max_sessions: int = 2, budget: int | None = None, ttl: float = 30.0) -> tuple[SessionTable, Clock]:
    clock = Clock()
    return SessionTable(max_sessions, budget, ttl, retry_after_s=RETRY_AFTER_S, clock=clock), clock


def held(t: SessionTable, key: str, nbytes: int = 1) -> None:
    t.admit(key, nbytes)
    t.start_building(key)
    t.add(key, key.upper())


def test_a_reservation_counts_at_once_and_the_open_claims_it():
    t, _ = table(max_sessions=2, budget=100)
    t.admit("a", 60, reserve_only=True)
    with pytest.raises(Busy):
        t.admit("b", 41)  # the reservation's bytes count before anything is built
    with pytest.raises(TooLarge):
        t.admit("huge", 101, reserve_only=True)  # refused at once, never reserved
    assert "huge" not in t
    assert t.claim("a") and not t.claim("a")  # the open takes it once
    assert t.start_building("a") and t.add("a", "A") and t.get("a") == "A"
    assert t.bytes_in_use == 60 and not t.claim("never-reserved")


def test_an_unclaimed_reservation_expires_and_a_closed_one_refuses_its_open():
    t, clock = table(ttl=30.0)
    t.admit("orphan", 5, reserve_only=True)  # its ingress went away before the open
    t.admit("opening", 5)  # an open in progress never expires
    clock.now += 31
    assert t.pop_expired() == [("orphan", None)]  # nothing was built: nothing to free
    assert t.keys() == ["opening"]
    t.admit("closed", 5, reserve_only=True)
    assert t.retire("closed") is None and "closed" not in t  # the slot is free at once
    assert not t.claim("closed")
    with pytest.raises(SessionLost):
        t.admit("closed", 5)  # its open, arriving after the close, builds nothing


def test_retry_after_is_the_soonest_grace_end_when_every_slot_is_parked():
    """The issue: dropped sockets' sessions (parked for resume_grace_s = 60) held the DiT
    slots 62-70 s while `busy` said a constant 5 s."""
    t, clock = table(max_sessions=2)
    held(t, "p1")
    held(t, "p2")
    assert t.expect_release("p1", 61.0) and t.expect_release("p2", 40.0)
    clock.now += 10
    with pytest.raises(Busy) as full:
        t.admit("new", 1)
    assert full.value.retry_after_s == 30.0 and "30 s" in full.value.message
    clock.now += 29.98
    assert t.retry_hint() == 0.5  # due now: at least a sweep's worth, never 0
    assert not t.expect_release("gone", 5.0)


def test_a_slot_whose_end_is_unknown_counts_as_the_poll_interval():
    t, clock = table(max_sessions=2, ttl=30.0)
    held(t, "parked")
    t.expect_release("parked", 60.0)
    held(t, "streaming")
    with t.hold("streaming"):  # a chunk in flight: its session may end any time after
        assert t.retry_hint() == RETRY_AFTER_S
    assert t.retry_hint() == RETRY_AFTER_S  # idle between its client's chunks: unknown too
    clock.now += 29.0  # ... until its idle TTL is nearer than the poll interval
    assert t.retry_hint() == 1.0


def test_a_resumed_session_is_no_longer_about_to_be_closed():
    t, _ = table(max_sessions=1)
    held(t, "parked")
    t.expect_release("parked", 60.0)
    assert t.retry_hint() == 60.0
    with t.hold("parked"):  # its resume's first call
        pass
    assert t.retry_hint() == RETRY_AFTER_S


def test_the_hint_rounds_up():
    t, clock = table(max_sessions=1)
    held(t, "p")
    t.expect_release("p", 12.34)
    assert t.retry_hint() == 12.4
