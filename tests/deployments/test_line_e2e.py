"""The waiting room through a real Serve app (issue 46, item 2): one DiT slot; the sessions that
find it taken wait in the application's line (the WaitingRoom replica) with `queued` notices,
start in order as the slot frees, and a client whose socket dropped takes its place again with
its token. /healthz and /v1/models say the line's length."""
from __future__ import annotations

import asyncio

import httpx
from ray import serve

from protocol import decode_reply
from protocol.codec import encode, validated
from protocol.messages import ErrorReply, FrameReply, InferRequest, Queued

APP = "line"


async def _next(client, kinds: tuple, timeout: float = 60.0):
    """The next reply of one of `kinds` (others skipped)."""
    while True:
        reply = decode_reply(await asyncio.wait_for(client.ws.recv(), timeout))
        if isinstance(reply, kinds):
            return reply


def _first(example, sid: str, token: str | None = None) -> bytes:
    poses, intrinsics = example.chunk(0)
    return encode(validated(InferRequest, {
        "session_id": sid, "image": example.image, "prompt": example.prompt, "num_frames": example.num_frames,
        "cameras": {"poses": poses, "intrinsics": intrinsics}, "client_chunk_id": 0, "queue_token": token}))


def test_sessions_wait_in_one_line_start_in_order_and_a_dropped_client_keeps_its_place(extra_app, example):
    app, connect = extra_app(APP, sessions={"max_sessions": 1, "max_waiting": 4, "resume": {"grace_s": 20.0},
                                            "retry_after_s": 0.5},
                             dit={"num_replicas": 1, "num_cpus": 0.1})

    def line() -> tuple[dict, dict]:
        health = httpx.get(f"{app.http}/healthz", timeout=10).json()["line"]
        return health, app.sessions()["line"]

    async def go():
        async with connect() as a, connect() as b, connect() as d:
            await a.send(_first(example, "a"))
            assert isinstance(await _next(a, (FrameReply, ErrorReply)), FrameReply)  # the one slot is a's
            await b.send(_first(example, "b"))
            assert (await _next(b, (Queued, FrameReply, ErrorReply))).position == 1
            async with connect() as c:
                await c.send(_first(example, "c"))
                queued_c = await _next(c, (Queued, FrameReply, ErrorReply))
                assert isinstance(queued_c, Queued) and queued_c.position == 2, queued_c
                health, models = await asyncio.to_thread(line)
                assert health["waiting"] == models["waiting"] == 2 and health["max_waiting"] == 4
                await a.reset("a")  # a's session ends: b starts, c moves up
                assert isinstance(await _next(b, (FrameReply, ErrorReply)), FrameReply)
                assert (await _next(c, (Queued,))).position == 1
            # c's socket dropped while it waited; d comes meanwhile, then c again with its token
            await d.send(_first(example, "d"))
            assert (await _next(d, (Queued,))).position == 1
            async with connect() as c2:
                await c2.send(_first(example, "c", token=queued_c.queue_token))
                back = await _next(c2, (Queued,))
                assert back.position == 1 and back.queue_token == queued_c.queue_token
                assert (await _next(d, (Queued,))).position == 2  # c's old place is ahead of d's
                await b.reset("b")
                assert isinstance(await _next(c2, (FrameReply, ErrorReply)), FrameReply)
                assert (await _next(d, (Queued,))).position == 1
    try:
        asyncio.run(go())
    finally:
        serve.delete(APP)


def _next_chunk(example, sid: str, k: int) -> bytes:
    poses, intrinsics = example.chunk(k)
    return encode(validated(InferRequest, {"session_id": sid, "client_chunk_id": k,
                                           "cameras": {"poses": poses, "intrinsics": intrinsics}}))


def test_one_client_holds_its_share_of_the_line_and_an_idle_seat_yields_to_it(extra_app, example):
    """Issue 54 items 1, 2 and 5 through Serve (every socket from one address): with one place
    per principal a second waiting session is refused `busy` naming the cap; the waiting
    session's token sent from another socket moves its place there and ends it on the first
    (`session_lost`); the seat's holder, idle for yield_idle_s while the other waits, gets
    `yielded` and the waiter starts; the holder's next infer waits in line and its session goes
    on at chunk 1 once the seat frees."""
    app, connect = extra_app(f"{APP}-yield", sessions={
        "max_sessions": 1, "max_waiting": 4, "max_waiting_per_principal": 1, "yield_idle_s": 2.0,
        "resume": {"grace_s": 20.0}, "retry_after_s": 0.5}, dit={"num_replicas": 1, "num_cpus": 0.1})

    async def go():
        async with connect() as a, connect() as first_b, connect() as b, connect() as c:
            await a.send(_first(example, "a"))
            assert isinstance(await _next(a, (FrameReply, ErrorReply)), FrameReply)
            await first_b.send(_first(example, "b"))
            queued = await _next(first_b, (Queued, FrameReply, ErrorReply))
            assert queued.position == 1
            await c.send(_first(example, "c"))
            refused = await _next(c, (Queued, FrameReply, ErrorReply))
            assert isinstance(refused, ErrorReply) and refused.code.value == "busy", refused
            assert "max_waiting_per_principal: 1" in refused.message
            await b.send(_first(example, "b", token=queued.queue_token))  # its place moves to this socket
            assert (await _next(b, (Queued, FrameReply, ErrorReply))).position == 1
            moved = await _next(first_b, (FrameReply, ErrorReply))
            assert isinstance(moved, ErrorReply) and moved.code.value == "session_lost", moved
            assert "queue_token" in moved.message
            yielded = await _next(a, (ErrorReply,), timeout=30.0)  # a idles: its seat goes to b
            assert yielded.code.value == "yielded" and yielded.session_id == "a", yielded
            assert isinstance(await _next(b, (FrameReply, ErrorReply)), FrameReply)
            await a.send(_next_chunk(example, "a", 1))
            assert (await _next(a, (Queued, FrameReply, ErrorReply))).position == 1  # in line again
            await b.reset("b")
            back = await _next(a, (FrameReply, ErrorReply))
            assert isinstance(back, FrameReply) and back.chunk_id == 1, back
    try:
        asyncio.run(go())
    finally:
        serve.delete(f"{APP}-yield")
