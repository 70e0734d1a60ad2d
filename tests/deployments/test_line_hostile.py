"""The waiting line against hostile clients (issue 54), through real Connections: fake model
deployments, the room's replica class in process (no Ray). One address holds at most
`sessions.max_waiting_per_principal` places; a `queue_token` reused from a second socket moves
the place and ends the first socket's session with a typed error; a seat idle while others
wait yields: its session is kept, rejoins the line on its next infer and goes on after it."""
from __future__ import annotations

import asyncio

from deployments.config import SessionArgs
from deployments.ingress.connection import Backends
from deployments.ingress.line.room import WaitingRoom
from deployments.ingress.parking import SessionParking
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import (ControlRequest, ErrorReply, FrameReply, InferRequest, Paused, ResetRequest, ResumeOk,
                               ResumeRequest)
from protocol.requests import SessionStart, drive_request
from connection_fakes import ReplicaHandle
from line_rig import LineClient, fakes


class Rig:
    def __init__(self, **sessions) -> None:
        self.sessions = SessionArgs(max_waiting=16, resume={"grace_s": 30.0}, **sessions)
        self.log, self.dit, self.vae, text = fakes()
        self.room = WaitingRoom.func_or_class(self.sessions)
        parking = SessionParking.func_or_class(self.vae, self.dit, self.sessions)
        self.backends = Backends(text=text, vae=self.vae, dit=self.dit, room=ReplicaHandle(self.room),
                                 parking=ReplicaHandle(parking))

    def client(self, address: str) -> "Client":
        return Client(self.backends, self.sessions, address)


class Client(LineClient):
    """A client of the line (line_rig.py): its infers, its answers, its notices."""

    def infer(self, example, sid: str, k: int = 0, token: str | None = None) -> None:
        poses, intrinsics = example.chunk(k)
        first = {"image": example.image, "prompt": "p", "num_frames": 57, "queue_token": token} if k == 0 else {}
        self.ws.send(encode(validated(InferRequest, {
            "session_id": sid, **first, "cameras": {"poses": poses, "intrinsics": intrinsics}})))

    async def answers(self, n: int = 1, timeout: float = 10.0) -> list:
        return (await self.ws.wait_for(lambda sent: (lambda got: got if len(got) >= n else [])(
            [r for r in sent if isinstance(r, FrameReply) or isinstance(r, ErrorReply) and not r.is_notice]),
            timeout))[:n]

    def notices(self, code: ErrorCode) -> list[ErrorReply]:
        return [r for r in self.ws.sent if isinstance(r, ErrorReply) and r.code is code]


def test_one_address_holds_two_places_and_another_still_gets_one(example):
    """Issue 54 item 1: 16 sockets of one address took every place of the line."""
    async def go():
        rig = Rig()
        mine = [rig.client("10.0.0.1") for _ in range(3)]
        for i, c in enumerate(mine[:2]):
            c.infer(example, f"a{i}")
            await c.notice(i + 1)
        mine[2].infer(example, "a2")
        (refused,) = await mine[2].answers()
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY, refused
        assert "max_waiting_per_principal: 2" in refused.message and refused.retry_after_s
        other = rig.client("10.0.0.2")
        other.infer(example, "b")
        await other.notice(3)  # another address still gets a place
        for c in (*mine, other):
            await c.leave()
    asyncio.run(go())


def test_a_queue_token_reused_from_a_second_socket_ends_the_first_sockets_session(example):
    """Issue 54 item 5: the first socket stayed at `queued position 1` forever."""
    async def go():
        rig = Rig()
        first = rig.client("10.0.0.1")
        first.infer(example, "a")
        token = (await first.notice(1)).queue_token
        second = rig.client("10.0.0.1")
        second.infer(example, "a", token=token)
        assert (await second.notice(1)).queue_token == token
        (ended,) = await first.answers()
        assert isinstance(ended, ErrorReply) and ended.code is ErrorCode.SESSION_LOST, ended
        assert "queue_token" in ended.message and len(rig.room._book) == 1  # one place: the second socket's
        rig.dit.capacity = 1
        assert isinstance((await second.answers())[0], FrameReply)
        for c in (first, second):
            await c.leave()
    asyncio.run(go())


def test_an_idle_seat_yields_to_the_line_and_its_session_goes_on_after_its_turn(example):
    """Issue 54 item 2: a session that got its chunk 0 and sent nothing held the only seat
    while the line waited. Now its seat yields after yield_idle_s (its replicas' state closed,
    a `yielded` notice); its next infer waits in line and its session goes on, rebuilt from its
    journal (chunk 1 follows chunk 0)."""
    async def go():
        rig = Rig(yield_idle_s=1.0)
        rig.dit.capacity = 1
        holder, waiter = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        holder.infer(example, "h")
        (first,) = await holder.answers()
        assert isinstance(first, FrameReply) and first.chunk_id == 0
        held = set(rig.dit.held)
        waiter.infer(example, "w")
        await waiter.notice(1)
        (start,) = await waiter.answers(timeout=15.0)  # the holder idled: its seat went to the line
        assert isinstance(start, FrameReply) and start.session_id == "w"
        (yielded,) = holder.notices(ErrorCode.YIELDED)
        assert yielded.session_id == "h" and "idle" in yielded.message
        assert held <= rig.dit.closed  # its DiT state was freed
        holder.infer(example, "h", k=1)  # it comes back: it waits in line behind nobody but the full DiT
        await holder.notice(1)
        waiter.ws.send(encode(ResetRequest(session_id="w")))  # its session ends (a socket's end would park it)
        replies = await holder.answers(2, timeout=15.0)
        assert isinstance(replies[1], FrameReply) and replies[1].chunk_id == 1, replies
        assert len(rig.dit.restores) == 1  # rebuilt from its journal after its turn
        for c in (holder, waiter):
            await c.leave()
    asyncio.run(go())


def test_a_yielded_session_resumed_on_a_new_socket_waits_its_turn_before_its_rebuild(example):
    """A session that yielded and then dropped its socket is parked holding no replica state;
    resumed on a new socket, its next infer waits in line like its old socket's would have
    (not a rebuild past the line)."""
    async def go():
        rig = Rig(yield_idle_s=1.0)
        rig.dit.capacity = 1
        holder, waiter = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        holder.infer(example, "h")
        (first,) = await holder.answers()
        waiter.infer(example, "w")
        assert isinstance((await waiter.answers(timeout=15.0))[0], FrameReply)  # the holder yielded
        await holder.leave()
        back = rig.client("10.0.0.1")
        back.ws.send(encode(validated(ResumeRequest, {"session_id": "h", "resume_token": first.resume_token})))
        await back.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, ResumeOk)])
        back.infer(example, "h", k=1)
        await back.notice(1)
        assert rig.dit.restores == []  # nothing rebuilt while the seat is the waiter's
        waiter.ws.send(encode(ResetRequest(session_id="w")))  # its session ends (a socket's end would park it)
        replies = await back.answers(1, timeout=15.0)
        assert isinstance(replies[0], FrameReply) and replies[0].chunk_id == 1, replies
        assert len(rig.dit.restores) == 1
        for c in (back, waiter):
            await c.leave()
    asyncio.run(go())


def test_a_session_past_its_turn_yields_at_its_next_chunk_and_goes_on_after_the_line(example):
    """`sessions.max_turn_s`: a session that held its seat that long while others wait yields
    at its next chunk boundary (that chunk waits in line), and is rebuilt when its turn comes."""
    async def go():
        rig = Rig(max_turn_s=1.0, yield_idle_s=60.0)
        rig.dit.capacity = 1
        holder, waiter = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        holder.infer(example, "h")
        await holder.answers()
        waiter.infer(example, "w")
        await waiter.notice(1)
        await asyncio.sleep(1.2)
        holder.infer(example, "h", k=1)  # streaming on, past its turn
        assert isinstance((await waiter.answers(timeout=15.0))[0], FrameReply)
        (yielded,) = holder.notices(ErrorCode.YIELDED)
        assert "max_turn_s" in yielded.message
        await holder.notice(1)  # its chunk 1 waits in line
        waiter.ws.send(encode(ResetRequest(session_id="w")))
        replies = await holder.answers(2, timeout=15.0)
        assert isinstance(replies[1], FrameReply) and replies[1].chunk_id == 1, replies
        assert len(rig.dit.restores) == 1
        for c in (holder, waiter):
            await c.leave()
    asyncio.run(go())


def test_a_paused_drive_counts_as_idle_and_goes_on_when_its_keys_come_back(example):
    """A driven session with no key held makes no chunk: idle. It yields like an infer
    session; a control with keys then starts its next chunk, which waits in line."""
    async def go():
        rig = Rig(yield_idle_s=1.0)
        rig.dit.capacity = 1
        holder, waiter = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        holder.ws.send(encode(drive_request("d", SessionStart(example.image, "p"))))
        await holder.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, Paused)])  # chunk 0, no key
        waiter.infer(example, "w")
        assert isinstance((await waiter.answers(timeout=15.0))[0], FrameReply)
        (yielded,) = holder.notices(ErrorCode.YIELDED)
        assert yielded.session_id == "d"
        holder.ws.send(encode(ControlRequest(session_id="d", event_id=1, keys=["w"])))
        await holder.notice(1)
        waiter.ws.send(encode(ResetRequest(session_id="w")))
        chunk1 = await holder.ws.wait_for(
            lambda sent: [r for r in sent if isinstance(r, FrameReply) and r.chunk_id == 1], 15.0)
        assert chunk1[0].session_id == "d" and len(rig.dit.restores) == 1
        for c in (holder, waiter):
            await c.leave()
    asyncio.run(go())
