"""Parking against hostile and unlucky clients (issue 31), through a real app (/parkhostile:
one ingress and one DiT replica, sessions parked for GRACE_S, client addresses taken from
X-Forwarded-For so that one test process can be several clients, a 0.1 s release timeout so
that chunks in flight outlast it).

* A flood of bogus `resume` claims from many sockets does not keep another client's dropped
  session from parking, nor its resume from being answered.
* One address that drops more sessions than the per-client cap evicts only its own oldest
  (whose resume then says `evicted`); another address's parked session still resumes.
* Chunks still in flight when the socket drops are parked with the session once answered:
  a resume gets their replies.
"""
from __future__ import annotations

import asyncio
import collections
import time

import pytest
from websockets.exceptions import ConnectionClosed

from deployments.ingress.parking import MAX_PER_CLIENT, new_token
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, ResumeOk
from protocol.codec import encode
from protocol.messages import ResumeRequest

GRACE_S = 20.0
FLOOD_SOCKETS = 32  # from 4 addresses
FLOOD_ADDRESSES = 4
APP = "parkhostile"


@pytest.fixture(scope="module")
def park_app(extra_app):
    from ray import serve

    app, _ = extra_app(
        APP,
        # Room on the one DiT replica for every session parked here; no idle TTL in the way.
        sessions={"max_sessions": 8, "idle_ttl_s": 120.0, "resume": {"grace_s": GRACE_S}},
        dit={"num_replicas": 1},
        # Flooding sockets that hammer past their claims' limit are closed (and reconnect).
        connection={"release_timeout_s": 0.1, "trust_forwarded_for": True, "max_connections_per_client": 16,
                    "max_messages_per_s": 10, "message_burst": 20})
    yield app
    serve.delete(APP)


def _as(addr: str) -> dict:
    return {"X-Forwarded-For": addr}


async def _start_and_drop(connect_url, app, addr: str, sid: str, example) -> str:
    """A session of one chunk from `addr`, its socket then closed: its resume token."""
    async with connect_url(app.ws, _as(addr)) as c:
        await c.infer(sid, example, 0, first=True)
        first = await c.recv()
    assert isinstance(first, FrameReply), first
    return first.resume_token


async def _resume(connect_url, app, addr: str, sid: str, token: str, reset: bool = True):
    """`resume` from a new socket of `addr`: (its replies up to `resumed` or an error, seconds taken)."""
    async with connect_url(app.ws, _as(addr)) as c:
        t0 = time.monotonic()
        await c.send(encode(ResumeRequest(session_id=sid, resume_token=token)))
        replies = [await c.recv(timeout=90)]
        while isinstance(replies[-1], FrameReply):
            replies.append(await c.recv(timeout=90))
        took = time.monotonic() - t0
        if reset and isinstance(replies[-1], ResumeOk):
            await c.reset(sid)
    return replies, took


def test_a_flood_of_bogus_claims_does_not_starve_parking(park_app, connect_url, example):
    """FLOOD_SOCKETS sockets loop `resume` with random tokens; meanwhile another client's
    session is dropped and resumed: it was parked, and the resume is answered (bounded wait).
    Before: each bogus claim slept 2 s inside the parking's 5 request slots, the park at the
    drop timed out after 10 s and the session was lost (`unauthorized`)."""
    counts: collections.Counter = collections.Counter()

    async def flood(addr: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with connect_url(park_app.ws, _as(addr)) as c:
                    while not stop.is_set():
                        await c.send(encode(ResumeRequest(session_id="bogus", resume_token=new_token())))
                        reply = await c.recv(timeout=90)
                        counts[reply.code.value if isinstance(reply, ErrorReply) else reply.type] += 1
            except (ConnectionClosed, OSError, TimeoutError):
                counts["closed"] += 1
                await asyncio.sleep(0.2)

    async def go():
        stop = asyncio.Event()
        flooders = [asyncio.create_task(flood(f"10.66.0.{i % FLOOD_ADDRESSES}", stop)) for i in range(FLOOD_SOCKETS)]
        try:
            await asyncio.sleep(4.0)  # the flood is on
            token = await _start_and_drop(connect_url, park_app, "10.1.1.1", "victim", example)
            await asyncio.sleep(0.5)  # dropped during the flood
            replies, took = await _resume(connect_url, park_app, "10.1.1.1", "victim", token)
        finally:
            stop.set()
            await asyncio.gather(*flooders, return_exceptions=True)
        return replies, took

    replies, took = asyncio.run(go())
    assert isinstance(replies[-1], ResumeOk) and replies[-1].next_chunk_id == 1, replies
    assert counts["unauthorized"] > 0, counts  # the flood's claims were made and refused
    print(f"RELIABILITY parking-flood: sockets={FLOOD_SOCKETS} addresses={FLOOD_ADDRESSES} "
          f"refused={dict(counts)} victim_resumed_in={took:.2f}s")


def test_one_address_over_the_cap_evicts_only_its_own_sessions(park_app, connect_url, example):
    """Without auth: address B parks one session, then address A opens and drops one more than
    the per-client cap. B's session resumes; A's oldest is told it was evicted."""
    async def go():
        b_token = await _start_and_drop(connect_url, park_app, "10.2.0.2", "b-session", example)
        a_tokens = []
        for i in range(MAX_PER_CLIENT + 1):
            a_tokens.append(await _start_and_drop(connect_url, park_app, "10.2.0.1", f"a{i}", example))
            await asyncio.sleep(0.5)  # parked before the next one
        b, _ = await _resume(connect_url, park_app, "10.2.0.2", "b-session", b_token)
        a0, _ = await _resume(connect_url, park_app, "10.2.0.1", "a0", a_tokens[0])
        rest = [(await _resume(connect_url, park_app, "10.2.0.1", f"a{i}", t))[0][-1]
                for i, t in enumerate(a_tokens) if i > 0]  # (and frees them)
        return b, a0, rest

    b, a0, rest = asyncio.run(go())
    assert isinstance(b[-1], ResumeOk), b
    assert isinstance(a0[-1], ErrorReply) and a0[-1].code is ErrorCode.SESSION_LOST, a0
    assert "evicted" in a0[-1].message and "grace period" not in a0[-1].message, a0[-1].message
    assert all(isinstance(r, ResumeOk) for r in rest), rest


def test_chunks_in_flight_at_the_drop_are_parked_once_answered(park_app, connect_url, example):
    """Chunk 0 answered, chunks 1 and 2 pipelined, the socket aborted at once: they run past
    the 0.1 s release timeout. The session is parked once they are answered, and a resume
    from chunk 1 gets both replies. Before: not parked ("a chunk ... is still running")."""
    async def go():
        async with connect_url(park_app.ws, _as("10.3.0.1")) as a:
            await a.infer("inflight", example, 0, first=True)
            first = await a.recv()
            await a.infer("inflight", example, 1, first=False)
            await a.infer("inflight", example, 2, first=False)
            a.ws.transport.abort()  # no close handshake, both chunks in flight
        async with connect_url(park_app.ws, _as("10.3.0.1")) as b:
            await b.send(encode(ResumeRequest(session_id="inflight", resume_token=first.resume_token, resume_from=1)))
            replies = [await b.recv(timeout=90)]
            while isinstance(replies[-1], FrameReply):
                replies.append(await b.recv(timeout=90))
            if isinstance(replies[-1], ResumeOk):
                await b.reset("inflight")
        return replies

    replies = asyncio.run(go())
    *frames, done = replies
    assert isinstance(done, ResumeOk) and done.next_chunk_id == 3 and done.replayed == 2, replies
    assert [r.chunk_id for r in frames] == [1, 2]
