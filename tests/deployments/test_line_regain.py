"""The WaitingRoom's replica lost (issue 54, item 4), without Ray: the book's rejoin, the room's
refusal of an earlier replica's tickets, and real Connections whose room is killed while three
sessions wait (the room's class in process behind a handle that fails the calls in flight, as an
`ActorDiedError` does, and routes the next ones to a fresh replica). Before the fix the waiting
sessions were answered `session_lost` and their places were gone. Through Serve:
tests/deployments/test_line_room_killed.py."""
from __future__ import annotations

import asyncio

import pytest

from deployments.config import SessionArgs
from deployments.ingress.connection import Backends
from deployments.ingress.health import line_lost
from deployments.ingress.line.book import LineBook
from deployments.ingress.line.room import TicketOfAnotherRoom, WaitingRoom
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, InferRequest
from line_rig import LineClient, fakes


def test_a_rejoined_place_keeps_its_order_ahead_of_newcomers_and_is_never_refused_as_full():
    old = LineBook(max_waiting=2, grace_s=30.0, seat_ttl_s=60.0, first=1000)
    a, b = old.join("x", 3), old.join("y", None)
    orders = {p.token: old.order_of(p.ticket) for p in (a, b)}
    new = LineBook(max_waiting=2, grace_s=30.0, seat_ttl_s=60.0, first=5000)  # the next replica, empty
    c = new.join("z", 3)  # a newcomer before the places rejoin
    d = new.join("w", 3)
    b2 = new.rejoin("y", None, b.token, orders[b.token], waited_s=4.0)
    a2 = new.rejoin("x", 3, a.token, orders[a.token], waited_s=5.0)  # over max_waiting: it was in line
    assert [new.position(t.ticket) for t in (a2, b2, c, d)] == [1, 2, 3, 4]
    assert a2.ticket >= 5000 and new.order_of(a2.ticket) == orders[a.token]
    again = new.rejoin("x", 3, a.token, orders[a.token], waited_s=5.1)  # a rejoin asked twice: one place
    assert len(new) == 4 and new.position(again.ticket) == 1 and new.position(a2.ticket) == 0
    assert new.seat(again.ticket) == pytest.approx(5.1, abs=0.5)  # its wait counts from its first join


def test_a_replica_of_the_room_refuses_the_tickets_of_the_one_before_it():
    async def go():
        sessions = SessionArgs(max_waiting=4)
        old = WaitingRoom.func_or_class(sessions)
        place, version = await old.join("x", 3)
        await asyncio.sleep(0.001)
        new = WaitingRoom.func_or_class(sessions)
        with pytest.raises(TicketOfAnotherRoom):
            await new.wait(place.ticket, version, 0.1)
        with pytest.raises(TicketOfAnotherRoom):
            await new.refused(place.ticket, 1)
        mine, _ = await new.join("y", 3)
        assert mine.ticket > place.ticket and mine.order > place.order > 0
        for room in (old, new):
            room._sweeper.cancel()
    asyncio.run(go())


def test_healthz_calls_a_room_that_did_not_answer_degraded():
    assert line_lost({"error": "the waiting room did not answer"})
    assert not line_lost({"waiting": 0, "max_waiting": 16}) and not line_lost(None)


class KillableRoom:
    """The room's handle (`.method.remote(...)`) over a replica that can be killed: its calls in
    flight then fail (as Serve's `ActorDiedError`), the next ones wait for its successor, which
    starts `restart_s` later with an empty book."""

    def __init__(self, sessions: SessionArgs) -> None:
        self.sessions = sessions
        self.replica = WaitingRoom.func_or_class(sessions)
        self.died = asyncio.Event()
        self.up = asyncio.Event()
        self.up.set()
        self.failed = 0

    def __getattr__(self, method: str):
        room = self

        class Method:
            @staticmethod
            def remote(*args):
                return room.call(method, args)

        return Method

    async def call(self, method: str, args: tuple):
        await self.up.wait()
        died = self.died
        call = asyncio.ensure_future(getattr(self.replica, method)(*args))
        dead = asyncio.ensure_future(died.wait())
        await asyncio.wait({call, dead}, return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if call.done():
            return call.result()
        call.cancel()
        self.failed += 1
        raise RuntimeError("ActorDiedError: the actor died unexpectedly before finishing this task")

    async def kill(self, restart_s: float) -> None:
        self.up.clear()
        self.died.set()
        self.replica._sweeper.cancel()
        await asyncio.sleep(restart_s)
        self.replica = WaitingRoom.func_or_class(self.sessions)
        self.died = asyncio.Event()
        self.up.set()


class Client(LineClient):
    """A client of the line (line_rig.py): its session's start and its first answer."""

    NOTICE_TIMEOUT_S = 20.0

    def start(self, example, sid: str) -> None:
        poses, intrinsics = example.chunk(0)
        self.ws.send(encode(validated(InferRequest, {
            "session_id": sid, "image": example.image, "prompt": "p", "num_frames": 33,
            "cameras": {"poses": poses, "intrinsics": intrinsics}})))

    def answers(self, sent: list | None = None) -> list:
        return [r for r in (self.ws.sent if sent is None else sent) if isinstance(r, (FrameReply, ErrorReply))]

    async def answer(self):
        return (await self.ws.wait_for(self.answers, timeout=20.0))[0]


def test_sessions_waiting_when_the_room_is_killed_keep_their_order_and_are_admitted(example):
    """Three sessions wait (positions 1-3); the room's replica dies and its successor starts 6 s
    later (a notice period passes meanwhile). No session gets an error: each hears its position
    while the room is down, takes its place again in the new replica in its old order (the book
    holds the three, 1-2-3), and each starts as a place frees."""
    async def go():
        sessions = SessionArgs(max_waiting=4, resume={"grace_s": 30.0})
        _, dit, vae, text = fakes()
        room = KillableRoom(sessions)
        backends = Backends(text=text, vae=vae, dit=dit, room=room)
        clients = [Client(backends, sessions, f"10.0.0.{i}") for i in (1, 2, 3)]
        for i, c in enumerate(clients):
            c.start(example, f"s{i}")
            await c.notice(i + 1)
        sent = [len(c.ws.sent) for c in clients]
        await room.kill(restart_s=6.0)
        assert room.failed >= 3  # every waiting seat's long poll failed with the replica
        for i, c in enumerate(clients):
            await c.notice(i + 1, after=sent[i])  # told its place while the room was down
        book = room.replica._book
        for _ in range(100):
            if len(book) == 3:
                break
            await asyncio.sleep(0.05)
        by_join = sorted(book._waiting, key=lambda t: book._waiting[t].joined)  # their first joins, kept
        assert [book.place(t).position for t in by_join] == [1, 2, 3]
        assert not [c.answers() for c in clients if c.answers()]
        dit.capacity = 1
        assert isinstance(await clients[0].answer(), FrameReply)
        await clients[1].notice(1)
        assert not clients[1].answers() and not clients[2].answers()
        await clients[0].leave()
        assert isinstance(await clients[1].answer(), FrameReply)
        await clients[1].leave()
        assert isinstance(await clients[2].answer(), FrameReply)
        await clients[2].leave()
        room.replica._sweeper.cancel()
    asyncio.run(go())


def test_a_room_that_does_not_come_back_ends_the_wait_with_busy_not_session_lost(example, monkeypatch):
    from deployments.ingress.line import regain  # noqa: PLC0415

    monkeypatch.setattr("deployments.ingress.line.seat.ROOM_LOST_S", 1.5)

    async def go():
        sessions = SessionArgs(max_waiting=4)
        _, dit, vae, text = fakes(shared=False)
        room = KillableRoom(sessions)
        c = Client(Backends(text=text, vae=vae, dit=dit, room=room), sessions, "10.0.0.1")
        c.start(example, "s")
        await c.notice(1)
        killing = asyncio.ensure_future(room.kill(restart_s=60.0))
        answer = await c.answer()
        assert isinstance(answer, ErrorReply) and answer.code is ErrorCode.BUSY, answer
        assert "did not come back" in answer.message and answer.retry_after_s == regain.LOST_RETRY_AFTER_S
        await c.leave()
        killing.cancel()
    asyncio.run(go())
