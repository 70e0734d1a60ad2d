"""ClientPolicy: flood, silence and unread-reply limits of one WebSocket (fake clock)."""
from __future__ import annotations

import pytest

from deployments.client_policy import ClientPolicy
from deployments.config import ConnectionArgs

ARGS = ConnectionArgs(max_messages_per_s=10, message_burst=3, first_message_timeout_s=5, idle_timeout_s=60,
                      max_unsent_replies=4)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_frame_must_come_in_time_then_silence_is_allowed_while_busy():
    clock = Clock()
    policy = ClientPolicy(ARGS, clock)
    clock.now += 4.0
    assert policy.wait_s(busy=False) == pytest.approx(1.0)
    clock.now += 1.0
    assert policy.wait_s(busy=False) is None
    assert policy.silence_reason() == "no message within 5 s of connecting"
    assert policy.on_frame(unsent_replies=0) is None  # a late frame still counts
    clock.now += 59.0
    assert policy.wait_s(busy=False) == pytest.approx(1.0)
    clock.now += 100.0
    assert policy.wait_s(busy=True) == 60  # chunks in flight: waiting for replies is not idling
    policy.on_reply()  # the last reply restarts the idle clock
    clock.now += 30.0
    assert policy.wait_s(busy=False) == pytest.approx(30.0)
    clock.now += 30.0
    assert policy.wait_s(busy=False) is None and policy.silence_reason() == "idle for 60 s"


def test_a_flood_beyond_the_burst_and_rate_is_a_violation():
    clock = Clock()
    policy = ClientPolicy(ARGS, clock)
    assert [policy.on_frame(0) for _ in range(3)] == [None, None, None]  # the burst
    assert "more than 10 messages per second" in policy.on_frame(0)
    clock.now += 0.1  # one token back
    assert policy.on_frame(0) is None


def test_too_many_unsent_replies_is_a_violation():
    policy = ClientPolicy(ARGS, Clock())
    assert policy.on_frame(unsent_replies=3) is None
    assert policy.on_frame(unsent_replies=4) == "too many unread replies; read the replies"
