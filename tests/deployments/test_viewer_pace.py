"""Pace: a viewer socket's message-rate bound on the watch route (fake clock). Through the
app (a flood next to an owner and another viewer): test_sharing_flood.py."""
from __future__ import annotations

import pytest

from deployments.ingress.sharing.pace import FORGIVEN_PER_S, MAX_STRIKES, Pace
from deployments.share_args import SharingArgs

ARGS = SharingArgs(viewer_messages_per_s=10, viewer_message_burst=4)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_burst_is_read_then_busy_with_the_wait_and_the_rate_comes_back():
    clock = Clock()
    pace = Pace(ARGS, clock)
    assert [pace.take() for _ in range(4)] == [None] * 4
    over = pace.take()
    assert over is not None and over.close is None
    assert over.retry_after_s == pytest.approx(0.1)  # one token at 10 a second
    assert over.message.startswith("more than 10 messages per second on the watch route")
    clock.now += 0.1
    assert pace.take() is None and pace.over == 1


def test_key_driving_at_the_rate_is_never_refused():
    clock = Clock()
    pace = Pace(ARGS, clock)
    for _ in range(1000):  # 100 s of a message every 0.1 s
        assert pace.take() is None
        clock.now += 0.1


def test_a_socket_that_keeps_flooding_is_closed_and_one_that_overshoots_now_and_then_is_not():
    clock = Clock()
    pace = Pace(ARGS, clock)
    for _ in range(4):
        pace.take()
    answers = [pace.take() for _ in range(MAX_STRIKES + 1)]  # no time passes: every one is over
    assert all(a is not None for a in answers)
    assert [a.close for a in answers[:-1]] == [None] * MAX_STRIKES
    assert answers[-1].close == "more than 10 messages per second; slow down"  # the camera route's words

    clock = Clock()
    pace = Pace(ARGS, clock)
    for _ in range(10 * MAX_STRIKES):  # one message over the bound a second, forgiven as fast
        for _ in range(4):
            pace.take()
        over = pace.take()
        assert over is not None and over.close is None
        clock.now += 1.0 / FORGIVEN_PER_S
