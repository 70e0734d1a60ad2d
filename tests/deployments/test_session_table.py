"""SessionTable: admission by count and bytes, authoritative lookup, idle expiry, resize."""
from __future__ import annotations

import pytest

from deployments.errors import Busy, SessionLost, TooLarge
from deployments.replicas.session_table import SessionTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(max_sessions: int = 2, budget: int | None = None, ttl: float = 10.0) -> tuple[SessionTable, Clock]:
    clock = Clock()
    return SessionTable(max_sessions, budget, ttl, retry_after_s=3.0, clock=clock), clock


def test_admission_by_slots_and_by_bytes():
    t, _ = table(max_sessions=2, budget=100)
    t.admit("a", 60)
    t.add("a", "A")
    with pytest.raises(Busy) as e:
        t.admit("b", 41)  # 60 + 41 > 100
    assert e.value.retry_after_s == 3.0 and "budget" in e.value.message
    t.admit("b", 40)  # counts at once, before the open finishes
    with pytest.raises(Busy, match="slots"):
        t.admit("c", 0)
    with pytest.raises(SessionLost):
        t.get("b")  # still opening
    t.add("b", "B")
    assert (len(t), t.free_slots, t.bytes_in_use) == (2, 0, 100)
    assert t.pop("a") == "A" and t.pop("a") is None
    t.admit("c", 60)
    assert t.pop("c") is None and (len(t), t.bytes_in_use) == (1, 40)  # a failed open gives it back


def test_unknown_sessions_are_lost_not_restarted():
    t, _ = table()
    with pytest.raises(SessionLost):
        t.get("nope")
    with pytest.raises(SessionLost):
        with t.hold("nope"):
            pass
    assert "nope" not in t


def test_idle_sessions_expire_but_not_while_a_call_holds_them():
    t, clock = table(max_sessions=10, ttl=10.0)
    for k in ("idle", "busy", "fresh", "opening"):
        t.admit(k, 1)
    for k in ("idle", "busy", "fresh"):
        t.add(k, k.upper())
    clock.now += 11
    t.admit("new", 1)
    t.add("new", "NEW")
    with t.hold("busy"):
        assert sorted(t.pop_expired()) == [("fresh", "FRESH"), ("idle", "IDLE")]
        clock.now += 11
    assert t.pop_expired() == [("new", "NEW")]  # "busy" was refreshed when its call ended
    clock.now += 10.5
    assert t.pop_expired() == [("busy", "BUSY")]
    assert "opening" in t  # a reservation whose open is still running never expires


def test_resize_respects_the_budget():
    t, _ = table(budget=100)
    for k in ("a", "b"):
        t.admit(k, 30)
        t.add(k, k.upper())
    assert t.resize("a", 70) and t.bytes_in_use == 100
    assert not t.resize("b", 31) and t.bytes_in_use == 100


def test_a_retired_session_frees_its_slot_at_once_and_its_bytes_once_released():
    t, _ = table(max_sessions=1, budget=100)
    t.admit("a", 70)
    t.add("a", "A")
    assert t.retire("a") == ("A", 70) and t.retire("a") is None
    assert (len(t), t.free_slots, t.bytes_in_use) == (0, 1, 70)  # its step may still run
    with pytest.raises(SessionLost):
        t.get("a")  # queued calls of the closed session find nothing
    with pytest.raises(Busy, match="budget"):
        t.admit("b", 40)  # the slot is free, the memory not yet
    t.admit("b", 30)
    t.released(70)
    assert t.bytes_in_use == 30


def test_a_close_of_an_open_still_queued_frees_its_slot_at_once():
    t, _ = table(max_sessions=1, budget=100)
    t.admit("a", 60)  # reserved; waiting for the replica's lock
    assert t.retire("a") is None
    assert (len(t), t.bytes_in_use, t.free_slots) == (0, 0, 1)
    assert t.start_building("a") is False  # its turn comes: it builds nothing


def test_a_close_during_the_open_makes_the_open_give_everything_back():
    t, _ = table(max_sessions=1, budget=100)
    t.admit("a", 60)
    assert t.start_building("a")
    assert t.retire("a") is None  # the client left while its open was being built
    assert (len(t), t.bytes_in_use) == (1, 60)  # the state being built still counts
    assert t.add("a", "A") is False  # the open learns it was closed: it frees its state
    assert (len(t), t.bytes_in_use, t.free_slots) == (0, 0, 1)
    with pytest.raises(SessionLost):
        t.get("a")


def test_an_open_that_arrives_after_its_close_is_refused_and_holds_nothing():
    t, clock = table(max_sessions=1)
    assert t.retire("late") is None  # the close overtook the open on its way
    with pytest.raises(SessionLost, match="closed"):
        t.admit("late", 10)
    assert (len(t), t.bytes_in_use, t.free_slots) == (0, 0, 1)
    t.admit("other", 10)  # other keys are unaffected
    assert t.add("other", "O")
    clock.now += 10_000  # closed keys are forgotten after a while (keys are never reused)
    t.pop("other")
    t.admit("late", 10)


def test_admission_counts_held_bytes_plus_the_largest_working_set():
    """Calls run one at a time per replica: the budget covers every session's held bytes plus
    one chunk's working set (the largest)."""
    t, _ = table(max_sessions=4, budget=100)
    t.admit("a", 40, working=30)  # 40 + 30 = 70
    t.add("a", "A")
    assert (t.bytes_in_use, t.working_bytes, t.reserved_bytes) == (40, 30, 70)
    with pytest.raises(Busy):
        t.admit("b", 31, working=10)  # 40 + 31 + max(30, 10) = 101
    t.admit("b", 30, working=5)  # 40 + 30 + 30 = 100
    t.add("b", "B")
    assert t.reserved_bytes == 100
    assert not t.resize("b", 31)
    t.pop("a")
    assert (t.bytes_in_use, t.working_bytes) == (30, 5)


def test_a_session_that_never_fits_is_too_large_not_busy():
    t, _ = table(max_sessions=2, budget=100)
    with pytest.raises(TooLarge) as e:
        t.admit("huge", 90, working=11)
    assert e.value.code.value == "too_large" and "whole session budget" in e.value.message
    assert len(t) == 0
    t.admit("a", 90, working=10)  # exactly the budget


def test_offline_sessions_count_apart_from_the_live_slots_and_bytes_count_all():
    """Issue 46: with max_offline_sessions (the DiT's), a job beyond its bound is busy while
    live slots are free, and jobs never take a live slot; the budget counts both."""
    clock = Clock()
    t = SessionTable(2, 100, 10.0, retry_after_s=3.0, clock=clock, max_offline_sessions=1)
    t.admit("job", 30, offline=True)
    with pytest.raises(Busy, match="offline .*max_offline_sessions") as e:
        t.admit("job2", 0, offline=True)
    assert e.value.retry_after_s == 3.0
    t.admit("a", 30)
    t.admit("b", 30)  # both live slots, beside the job
    assert (len(t), t.free_slots, t.held_by_class()) == (3, 0, (2, 1))
    with pytest.raises(Busy, match="all 2 session slots"):
        t.admit("c", 0)
    t.pop("b")
    with pytest.raises(Busy, match="budget"):
        t.admit("c", 41)  # a live slot is free, but 30 + 30 + 41 > 100: the job's bytes count
    assert t.is_offline("job") and not t.is_offline("a") and not t.is_offline("gone")
    assert t.apart_keys() == ["job"]  # what the router's stats list apart (router.py)
    t.pop("job")
    t.admit("job2", 0, offline=True)


def test_without_an_offline_bound_offline_sessions_take_live_slots():
    """The VAE's table: every session against max_sessions, its class kept for the lock."""
    t, _ = table(max_sessions=2)
    t.admit("job", 0, offline=True, bucket=("b", 1))
    t.admit("a", 0, bucket=("b", 2))
    with pytest.raises(Busy, match="all 2 session slots"):
        t.admit("b", 0)
    assert t.free_slots == 0 and t.is_offline("job") and t.bucket("a") == ("b", 2)
    assert t.live_buckets() == [("b", 2)]
    assert t.apart_keys() == []  # no bound apart: the job takes a live slot, as the router counts it


def test_the_frame_rate_floor_does_not_count_a_parked_session_until_it_is_used_again():
    """Issue 54: a parked session (its holder said when it will be closed) streams nothing:
    the floor's live sessions leave it out; its next call counts it again."""
    t, _ = table(max_sessions=3)
    t.admit("a", 0, bucket=("b", 1))
    t.add("a", object())
    t.admit("p", 0, bucket=("b", 2))
    t.add("p", object())
    assert t.expect_release("p", 30.0)
    assert t.live_buckets() == [("b", 1)]
    with t.hold("p"):
        pass
    assert sorted(t.live_buckets()) == [("b", 1), ("b", 2)]
