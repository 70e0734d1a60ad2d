"""The waiting room's bookkeeping (deployments/ingress/line/book.py), on a fake clock: first
come first served, a bounded line, places kept for a dropped client's token, ETAs played
forward from the running sessions' progress."""
from __future__ import annotations

import pytest

from deployments.ingress.line.book import (DEFAULT_OPEN_ENDED_S, EWMA, MIN_REMAINING_S, YIELD_SLACK_S, LineBook,
                                           LineFull)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def book(max_waiting: int = 4, grace_s: float = 60.0, seat_ttl_s: float = 300.0) -> tuple[LineBook, Clock]:
    clock = Clock()
    return LineBook(max_waiting, grace_s, seat_ttl_s, clock), clock


def test_first_come_first_served_and_a_leaver_moves_everyone_behind_up():
    b, _ = book()
    x, y, z = (b.join("o", 5) for _ in range(3))
    assert [b.position(p.ticket) for p in (x, y, z)] == [1, 2, 3]
    b.leave(y.ticket)
    assert [b.position(p.ticket) for p in (x, y, z)] == [1, 0, 2]
    b.seat(x.ticket)
    assert b.position(z.ticket) == 1 and len(b) == 1


def test_the_line_is_bounded():
    b, _ = book(max_waiting=2)
    b.join("o", 5)
    b.join("o", 5)
    with pytest.raises(LineFull):
        b.join("o", 5)


def test_a_token_takes_its_old_place_again_within_the_grace_period_only_for_its_owner():
    b, clock = book(grace_s=60.0)
    first = b.join("alice", 5)
    second = b.join("bob", 5)
    b.leave(first.ticket)  # alice's socket dropped
    assert b.position(second.ticket) == 1
    assert b.join("mallory", 5, token=first.token).token != first.token  # not alice: a new place, at the back
    back = b.join("alice", 5, token=first.token)
    assert back.token == first.token and back.position == 1 and b.position(second.ticket) == 2
    b.leave(back.ticket)
    clock.t += 61.0
    late = b.join("alice", 5, token=first.token)
    assert late.position == 3 and late.token != first.token  # the grace period is over: the back of the line


def test_a_token_still_in_line_moves_to_the_new_socket():
    """The client reconnected before its old socket's leave reached the room: one place, not two."""
    b, _ = book()
    first = b.join("alice", 5)
    b.join("bob", 5)
    again = b.join("alice", 5, token=first.token)
    assert again.position == 1 and len(b) == 2 and b.position(first.ticket) == 0
    b.leave(first.ticket)  # the old socket's late leave changes nothing
    assert b.position(again.ticket) == 1 and len(b) == 2


def test_etas_play_the_line_forward_as_processor_sharing():
    """Two sessions share the replica, the DiT's step (one chunk alone) 1 s. a has 8 chunks
    left, c 18: a ends after 16 s (both advance at half speed), then w1 (5 chunks) shares with
    c (10 left): w1 ends 10 s later, w2 takes its place, and so on."""
    b, clock = book()
    a, c = b.join("o", 10), b.join("o", 20)
    b.seat(a.ticket)
    b.seat(c.ticket)
    for t, chunks in ((2.0, 1), (4.0, 2)):
        clock.t = 1000.0 + t
        b.progress(a.ticket, chunks, 1.0)
        clock.t = 1000.0 + t + 1.0
        b.progress(c.ticket, chunks, 1.0)
    assert b.stats().step_s == pytest.approx(1.0)  # the DiT's step, not the interval a session sees (2 s)
    w1, w2, w3 = b.join("o", 5), b.join("o", 5), b.join("o", 5)
    assert b.place(w1.ticket).eta_s == pytest.approx(16.0)  # a's 8 steps at half speed
    assert b.place(w2.ticket).eta_s == pytest.approx(26.0)  # then w1's 5 beside c's 10 left
    assert b.place(w3.ticket).eta_s == pytest.approx(36.0)  # then w2's 5 beside c's 5 left
    b.end(a.ticket)
    assert b.place(w1.ticket).eta_s == pytest.approx(0.0)  # a place is free: now
    assert b.place(w2.ticket).eta_s == pytest.approx(10.0)  # w1's 5 steps beside c's 18: w1 ends first


def test_the_step_is_the_larger_of_the_dits_measure_and_the_interval_over_the_streaming_seats():
    b, clock = book()
    a = b.join("o", 10)
    b.seat(a.ticket)
    b.progress(a.ticket, 1, 1.0)
    b.progress(a.ticket, 2, 2.0)  # no time passed: the DiT's measure alone
    assert b.stats().step_s == pytest.approx(1.0 + EWMA * 1.0)
    b.progress(a.ticket, 2, 50.0)  # the same chunk again (a late report): no sample
    b.progress(a.ticket, 3, 0.0)  # nothing measured (a fake's timings, the same instant): the count only
    assert b.stats().step_s == pytest.approx(1.3)
    c = b.join("o", 10)
    b.seat(c.ticket)  # starting: not sharing the DiT yet
    clock.t += 4.0
    b.progress(a.ticket, 4, 0.1)  # 4 s for a chunk, a alone streaming: another stage bounds the rate
    assert b.stats().step_s == pytest.approx(1.3 + EWMA * (4.0 - 1.3))
    b.progress(c.ticket, 1, 2.11)  # c's first chunk: its start is no interval; the DiT's measure alone
    assert b.stats().step_s == pytest.approx(2.11)
    clock.t += 3.0
    b.progress(a.ticket, 5, 0.1)  # 3 s over the two streaming: 1.5 s
    assert b.stats().step_s == pytest.approx(2.11 + EWMA * (1.5 - 2.11))


def test_a_refusal_teaches_the_places_and_the_etas_wait_for_that_many_ends():
    """Three sessions ran together (a, c, d: 2, 4 and 6 chunks left, step 1 s); the replica
    then refuses the first in line with two ends needed (the frame-rate floor: its steps were
    measured slower). w waits for a and c to end: a after 2 x 3 = 6 s, c's 2 left at half speed
    4 s more; with one end needed it would start after a's 6 s."""
    b, _ = book()
    seats = [b.join("o", n) for n in (2, 5, 7)]
    for s in seats:
        b.seat(s.ticket)
        b.progress(s.ticket, 1, 1.0)
    b._seats[seats[0].ticket].done = 0  # 2 left
    w = b.join("o", 5)
    assert b.place(w.ticket).eta_s == pytest.approx(2 * 3)  # three places: one end (a's)
    b.refused(w.ticket, ends_needed=2)
    assert b.place(w.ticket).eta_s == pytest.approx(2 * 3 + 2 * 2)
    b.end(seats[0].ticket)
    assert b.place(w.ticket).eta_s == pytest.approx(4 * 2)  # two places now: c's 4 beside d's 6
    x = b.join("o", 5)
    b.refused(x.ticket, ends_needed=1)  # not the first in line: changes nothing
    assert b.place(w.ticket).eta_s == pytest.approx(4 * 2)
    b.seat(w.ticket)
    b.seat(x.ticket)  # four ran together after all: the places grow again
    y = b.join("o", 5)
    assert b.place(y.ticket).eta_s > 0 and b._places == 4


def test_no_eta_before_any_session_ran_and_open_ended_lengths_are_learned():
    b, clock = book()
    w = b.join("o", None)
    assert w.eta_s is None
    b.refused(w.ticket, ends_needed=1)  # the places are held by sessions the room never saw
    assert b.place(w.ticket).eta_s is None
    b.seat(w.ticket)
    clock.t += 30.0
    b.end(w.ticket)
    x = b.join("o", None)
    b.seat(x.ticket)
    y = b.join("o", None)
    assert b.place(y.ticket).eta_s == pytest.approx(30.0) != DEFAULT_OPEN_ENDED_S  # the one that ended: 30 s


def test_a_seat_not_heard_of_is_dropped_and_the_stats_count_the_waits():
    b, clock = book(seat_ttl_s=100.0)
    w = b.join("o", 3)
    clock.t += 7.0
    assert b.seat(w.ticket) == pytest.approx(7.0)
    stats = b.stats()
    assert (stats.waiting, stats.seated, stats.admitted_total, stats.waits_s) == (0, 1, 1, [pytest.approx(7.0)])
    assert b.stats().waits_s == []  # reported once
    clock.t += 101.0
    assert b.sweep() == [w.ticket] and b.stats().seated == 0


# ---- issue 54: one owner's share of the line, a moved place, ETAs that follow the yield rule ----

def test_one_owner_holds_at_most_its_share_of_the_line_and_another_still_gets_a_place():
    """Issue 54 item 1: 16 sockets from one address took the whole line (16 places)."""
    b = LineBook(16, 60.0, 300.0, Clock(), max_per_owner=2)
    first = b.join("addr:a", 5)
    b.join("addr:a", 5)
    with pytest.raises(LineFull, match="max_waiting_per_principal: 2"):
        b.join("addr:a", 5)
    assert b.join("addr:b", 5).position == 3  # another address: a place
    again = b.join("addr:a", 5, token=first.token)  # its own place again (another socket): no new place
    assert again.position == 1 and len(b) == 3


def test_a_place_moved_by_its_token_tells_the_old_ticket_once_asked():
    """Issue 54 item 5: the old socket stayed at `queued position 1` forever."""
    b, _ = book()
    first = b.join("alice", 5)
    again = b.join("alice", 5, token=first.token)
    old = b.place(first.ticket)
    assert old.position == 0 and old.moved and not b.place(again.ticket).moved
    b.leave(first.ticket)  # the old socket's session ended: forgotten
    assert not b.place(first.ticket).moved and b.position(again.ticket) == 1


def test_an_idle_seat_frees_at_most_yield_s_after_its_last_chunk():
    """Issue 54 item 3: an open-ended holder that stopped asking showed the same ETA for 49 s;
    with seats yielding after 20 s idle, its seat frees within 20 s (plus the check's slack)
    of its last chunk, and the ETA counts down."""
    clock = Clock()
    b = LineBook(4, 60.0, 300.0, clock, yield_s=20.0)
    a = b.join("a", None)
    b.seat(a.ticket)
    b.progress(a.ticket, 1, 1.0)
    w = b.join("w", 5)
    assert b.place(w.ticket).eta_s == pytest.approx(DEFAULT_OPEN_ENDED_S)  # streaming: its expected length
    clock.t += 5.0  # no chunk for 5 s (step 1 s): idle
    assert b.place(w.ticket).eta_s == pytest.approx(20.0 + YIELD_SLACK_S - 5.0)
    clock.t += 10.0
    assert b.place(w.ticket).eta_s == pytest.approx(20.0 + YIELD_SLACK_S - 15.0)


def test_an_eta_that_passed_is_estimated_again_not_repeated():
    """A holder that streams past its expected length: it is expected to go on as long again
    as it overran, not to end in MIN_REMAINING_S each time it is asked."""
    clock = Clock()
    b = LineBook(4, 60.0, 300.0, clock, yield_s=20.0)
    a = b.join("a", None)
    b.seat(a.ticket)
    w = b.join("w", 5)
    etas = []
    for k in range(1, 80):  # a chunk every 2 s for 158 s: past the 120 s expected
        clock.t += 2.0
        b.progress(a.ticket, k, 1.0)
        etas.append(b.place(w.ticket).eta_s)
    assert etas[-1] == pytest.approx(158.0 - DEFAULT_OPEN_ENDED_S) and etas[-1] > etas[-5] > MIN_REMAINING_S


def test_a_session_that_yielded_its_seat_rejoins_even_a_full_line():
    """It was admitted once: refusing its place again would lose it (issue 54)."""
    b = LineBook(1, 60.0, 300.0, Clock(), max_per_owner=1)
    b.join("a", 5)
    assert b.join("a", 5, rejoin=True).position == 2
    with pytest.raises(LineFull):
        b.join("b", 5)
