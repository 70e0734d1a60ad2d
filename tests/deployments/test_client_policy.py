"""ClientPolicy: flood, silence and unread-reply limits of one WebSocket (fake clock)."""
from __future__ import annotations

import pytest

from deployments.ingress.guards.client_policy import ClientPolicy
from deployments.config import ConnectionArgs

ARGS = ConnectionArgs(max_messages_per_s=10, message_burst=3, first_message_timeout_s=5, idle_timeout_s=60,
                      max_unsent_replies=4, max_bytes_per_s=1000, bytes_burst=4000, max_refused_frames=3)
MAX_MESSAGE = 2000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_frame_must_come_in_time_then_silence_is_allowed_while_busy():
    clock = Clock()
    policy = ClientPolicy(ARGS, MAX_MESSAGE, clock)
    clock.now += 4.0
    assert policy.wait_s(busy=False) == pytest.approx(1.0)
    clock.now += 1.0
    assert policy.wait_s(busy=False) is None
    assert policy.silence_reason() == "no message within 5 s of connecting"
    assert policy.on_frame(unsent_replies=0) is None  # a late frame still counts
    assert policy.on_outcome(refused=False, infer=True) is None
    clock.now += 59.0
    assert policy.wait_s(busy=False) == pytest.approx(1.0)
    clock.now += 100.0
    assert policy.wait_s(busy=True) == 60  # chunks in flight: waiting for replies is not idling
    policy.on_reply()  # the last reply restarts the idle clock
    clock.now += 30.0
    assert policy.wait_s(busy=False) == pytest.approx(30.0)
    clock.now += 30.0
    assert policy.wait_s(busy=False) is None and policy.silence_reason() == "idle for 60 s (no infer)"


def test_a_flood_beyond_the_burst_and_rate_is_a_violation():
    clock = Clock()
    policy = ClientPolicy(ARGS, MAX_MESSAGE, clock)
    assert [policy.on_frame(0) for _ in range(3)] == [None, None, None]  # the burst
    assert "more than 10 messages per second" in policy.on_frame(0)
    clock.now += 0.1  # one token back
    assert policy.on_frame(0) is None


def test_too_many_unsent_replies_is_a_violation():
    policy = ClientPolicy(ARGS, MAX_MESSAGE, Clock())
    assert policy.on_frame(unsent_replies=3) is None
    assert policy.on_frame(unsent_replies=4) == "too many unread replies; read the replies"


def test_frames_other_than_infers_do_not_keep_an_idle_socket_open():
    clock = Clock()
    policy = ClientPolicy(ARGS, MAX_MESSAGE, clock)
    policy.on_frame(0)
    policy.on_outcome(refused=False, infer=True)
    for _ in range(5):  # a reset every 50 s
        clock.now += 50.0
        assert policy.on_frame(0) is None
        assert policy.on_outcome(refused=False, infer=False) is None
    assert policy.wait_s(busy=False) is None  # 250 s since the last infer


def test_a_byte_flood_is_a_violation_even_below_the_message_rate():
    clock = Clock()
    policy = ClientPolicy(ARGS, MAX_MESSAGE, clock)
    assert policy.on_frame(0, nbytes=2000) is None
    assert policy.on_frame(0, nbytes=2000) is None  # the burst: two largest frames
    assert "MiB per second" in policy.on_frame(0, nbytes=2000)
    clock.now += 2.0  # 2000 bytes back
    assert policy.on_frame(0, nbytes=2000) is None


def test_the_default_byte_burst_is_two_largest_frames():
    policy = ClientPolicy(ConnectionArgs(), 5000, Clock())
    assert policy.on_frame(0, nbytes=5000) is None and policy.on_frame(0, nbytes=5000) is None
    assert policy.on_frame(0, nbytes=5000) is not None


def test_refused_frames_in_a_row_close_the_socket_an_accepted_one_resets_the_count():
    policy = ClientPolicy(ARGS, MAX_MESSAGE, Clock())
    assert policy.on_outcome(refused=True, infer=False) is None
    assert policy.on_outcome(refused=True, infer=False) is None
    assert policy.on_outcome(refused=False, infer=True) is None
    assert policy.on_outcome(refused=True, infer=False) is None
    assert policy.on_outcome(refused=True, infer=False) is None
    assert "3 frames in a row were refused" in policy.on_outcome(refused=True, infer=False)
