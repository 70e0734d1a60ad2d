"""Issue 31, through real Serve apps: a session that cannot fit is refused before any replica
works for it (the VAE runs no encode), and a `busy` while every DiT slot holds a parked
session (a dropped socket's, kept for resume) says when the first grace period ends."""
from __future__ import annotations

from dataclasses import replace
import asyncio
import time

import pytest

from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

LENIENT = Limits(max_aspect_ratio=1000.0, max_output_area=2**30, max_num_frames=4093)  # the server refuses, not the client
GRACE_S = 8.0  # sessions.resume.grace_s of the parking app
POLL_S = 1.0  # its retry_after_s: the hint where a slot's end is unknown
APP = "retryhint"


def conditions(stats_of, app: str) -> int:
    return sum(s["calls"].get("condition", 0) for s in stats_of(app, "VaeDeployment"))


def test_a_session_that_cannot_fit_is_refused_before_any_encode(strict_server, strict_connect, api_keys, example,
                                                                stats_of):
    """The strict app (12 MiB DiT budget, 4096 attention tokens): 4093 frames exceed the
    attention bound (too_large), a second 2041-frame session the budget (busy). Before, both
    were refused after their first VAE condition (16-36 s each on a CPU at 464x832)."""
    key = api_keys[-1]
    strict_server.wait_held(0)
    before = conditions(stats_of, "strict")

    async def go():
        async with strict_connect(key) as a, strict_connect(key) as b:
            start = SessionStart(example.image, example.prompt, num_frames=2041)
            t = time.perf_counter()
            await b.send(encode(infer_request("long", *example.chunk(0), start=replace(start, num_frames=4093),
                                              limits=LENIENT)))
            long = await b.recv()
            long_s = time.perf_counter() - t
            await a.send(encode(infer_request("first", *example.chunk(0), start=start, limits=LENIENT)))
            first = await a.recv()
            after_first = await asyncio.to_thread(conditions, stats_of, "strict")
            t = time.perf_counter()
            await b.send(encode(infer_request("second", *example.chunk(0), start=start, limits=LENIENT)))
            second = await b.recv()
            second_s = time.perf_counter() - t
            await a.reset("first")
        return long, long_s, first, after_first, second, second_s

    long, long_s, first, after_first, second, second_s = asyncio.run(go())
    assert isinstance(long, ErrorReply) and long.code is ErrorCode.TOO_LARGE and "attend" in long.message, long
    assert isinstance(first, FrameReply), first
    assert isinstance(second, ErrorReply) and second.code is ErrorCode.BUSY, second
    assert after_first == before + 1  # the admitted session's chunk 0 only
    assert conditions(stats_of, "strict") == after_first  # the busy one cost no encode either
    print(f"\nrefused at once: too_large in {long_s:.3f} s, busy in {second_s:.3f} s; VAE conditions "
          f"{before} -> {after_first} (the admitted session's only)")
    strict_server.wait_held(0)


@pytest.fixture(scope="module")
def parking_app(extra_app):
    yield extra_app(APP, dit={"num_replicas": 1},
                    sessions={"max_sessions": 2, "idle_ttl_s": 30.0, "resume": {"grace_s": GRACE_S}, "retry_after_s": POLL_S})
    from ray import serve

    serve.delete(APP)


def test_busy_while_the_slots_hold_parked_sessions_says_when_their_grace_ends(parking_app, example):
    """Both DiT slots hold sessions of dropped sockets (parked for GRACE_S): a new session's
    `busy` carries the end of the first grace period (before: the constant retry_after_s, so
    that a client retried into `busy` again and again), and a retry then is admitted."""
    _, connect = parking_app
    start = SessionStart(example.image, example.prompt, num_frames=example.num_frames, translation_scale=example.scale)

    async def go():
        drops = []
        for sid in ("dropped-1", "dropped-2"):
            async with connect() as c:
                await c.send(encode(infer_request(sid, *example.chunk(0), start=start)))
                assert isinstance(await c.recv(), FrameReply)  # with its resume token: it will be parked
            drops.append(time.monotonic())
        dropped = drops[0]  # the first grace period ends first
        async with connect() as c:
            hints = []
            deadline = time.monotonic() + GRACE_S / 2  # the parking and its hint take a moment
            while time.monotonic() < deadline:
                await c.send(encode(infer_request("new", *example.chunk(0), start=start)))
                reply = await c.recv()
                assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY, reply
                hints.append((time.monotonic() - dropped, reply.retry_after_s))  # since the first drop
                if reply.retry_after_s > POLL_S:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(hints[-1][1])
            await c.send(encode(infer_request("new", *example.chunk(0), start=start)))
            admitted = await c.recv()
            return hints, time.monotonic() - dropped, admitted

    hints, admitted_after_s, admitted = asyncio.run(go())
    at, hint = hints[-1]
    assert POLL_S < hint <= GRACE_S + 1.0 + 0.1, hints  # the grace's end, plus the parking's close
    assert at + hint >= GRACE_S, hints  # not before the first grace period ends
    assert isinstance(admitted, FrameReply), (hints, admitted)
    print(f"\nbusy hints (s after the first drop, retry_after_s): {[(round(a, 2), h) for a, h in hints]}; "
          f"admitted {admitted_after_s:.2f} s after the first drop (grace {GRACE_S} s)")
