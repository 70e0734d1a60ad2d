"""The waiting room through real Connections (issue 46, item 2): fake model deployments, the
room's replica class in process (no Ray). A new session that finds no place waits in line with
`queued` notices instead of getting `busy`, holds nothing on any replica meanwhile, starts by
itself when the DiT admits it, leaves the line at once when its socket ends, and takes its old
place again with its `queue_token`."""
from __future__ import annotations

import asyncio

import pytest

from deployments.config import AppArgs, SessionArgs
from deployments.errors import TooLarge
from deployments.ingress.connection import Backends, Connection
from deployments.ingress.line.room import WaitingRoom
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, InferRequest, Queued
from connection_fakes import FakeDeployment, FakeMetrics, ReplicaHandle, ScriptedSocket, SessionReplica


class Slots(SessionReplica):
    """A replica of `capacity` sessions: an admission (`admits`: the DiT's `reserve`, the VAE's
    `open`) beyond them answers `busy`."""

    capacity = 0  # full until a test makes room
    admits = "reserve"

    async def call(self, method: str, args: tuple):
        if method == self.admits:
            self.refuse = len(self.held) >= self.capacity
        return await super().call(method, args)


class Rig:
    def __init__(self, max_waiting: int = 4) -> None:
        self.log: list[str] = []
        self.sessions = SessionArgs(max_waiting=max_waiting, resume={"grace_s": 30.0})
        self.dit = Slots("dit", self.log, 0.0)
        self.vae = SessionReplica("vae", self.log, 0.0)
        self.room = WaitingRoom.func_or_class(self.sessions)
        text = FakeDeployment("text", self.log, 0.0)
        for d in (self.dit, self.vae, text):
            d.shared = True  # several connections
        self.backends = Backends(text=text, vae=self.vae, dit=self.dit, room=ReplicaHandle(self.room))

    def client(self, address: str = "10.0.0.1") -> "Client":
        return Client(self, address)


class Client:
    def __init__(self, rig: Rig, address: str, quota=None) -> None:
        self.ws = ScriptedSocket()
        args = AppArgs(sessions=rig.sessions)
        conn = Connection(self.ws, rig.backends, args, Limits(), CameraServerConfig(model="tiny"), FakeMetrics(),
                          quota=quota, key_id=None if quota is None else "k", client=address, resumable=True)
        self.run = asyncio.ensure_future(conn.run())

    def start(self, example, sid: str, token: str | None = None, num_frames: int = 33) -> None:
        poses, intrinsics = example.chunk(0)
        self.ws.send(encode(validated(InferRequest, {
            "session_id": sid, "image": example.image, "prompt": "p", "num_frames": num_frames, "queue_token": token,
            "cameras": {"poses": poses, "intrinsics": intrinsics}})))

    async def notice(self, position: int) -> Queued:
        found = await self.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, Queued)
                                                     and r.position == position])
        return found[-1]

    async def answer(self):
        return (await self.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, (FrameReply, ErrorReply))]))[0]

    async def leave(self) -> None:
        self.ws.leave()
        await asyncio.wait_for(self.run, 30)


def test_a_session_without_a_place_waits_in_line_and_starts_when_one_frees(example):
    async def go():
        rig = Rig()
        a = rig.client()
        a.start(example, "a")
        first = await a.notice(1)
        assert first.session_id == "a" and first.queue_token
        b = rig.client("10.0.0.2")
        b.start(example, "b")
        await b.notice(2)
        # Nothing is held for a waiting session: no VAE open, no text encode, no DiT open.
        assert not [e for e in rig.log if e.split(".")[0] in ("vae", "text") or e.startswith("dit.open")]
        rig.dit.capacity = 1  # a place frees: the first in line takes it, within a retry
        assert isinstance(await a.answer(), FrameReply)
        await b.notice(1)  # b is first now, and waits on: the one place is a's
        await asyncio.sleep(1.0)
        assert not [r for r in b.ws.sent if isinstance(r, (FrameReply, ErrorReply))]
        await a.leave()  # a's session ends: b starts
        assert isinstance(await b.answer(), FrameReply)
        assert len(rig.room._book) == 0 and rig.room._book.stats().seated == 1
        await b.leave()
        assert rig.room._book.stats().seated == 0  # both ends reached the room
    asyncio.run(go())


def test_the_first_in_line_refused_tells_the_room_how_many_sessions_must_end(example):
    """Two sessions run; the DiT refuses the first in line with two ends needed (its frame-rate
    floor): the room learns one place, and the ETA it sends waits for both ends."""
    async def go():
        rig = Rig()
        rig.dit.capacity = 2
        a, c = rig.client(), rig.client("10.0.0.3")
        a.start(example, "a", num_frames=57)
        c.start(example, "c", num_frames=33)  # ends before a
        assert isinstance(await a.answer(), FrameReply) and isinstance(await c.answer(), FrameReply)
        book = rig.room._book
        assert book.stats().seated == 2 and book._places == 2
        rig.dit.ends_needed = 2
        b = rig.client("10.0.0.2")
        b.start(example, "b")
        notice = await b.notice(1)
        assert book._places == 1  # 2 seats + 1 - 2 ends
        (ticket,) = book._waiting
        both_ends = book.place(ticket).eta_s
        book._places = 2  # had the replica needed one end only: the first one
        assert both_ends > book.place(ticket).eta_s > 0 and notice.eta_s == pytest.approx(both_ends, abs=0.1)
        for x in (a, c, b):
            await x.leave()
    asyncio.run(go())


def test_a_socket_that_leaves_the_line_frees_its_place_at_once_and_its_token_takes_it_again(example):
    async def go():
        rig = Rig()
        a, b = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        a.start(example, "a")
        token = (await a.notice(1)).queue_token
        b.start(example, "b")
        await b.notice(2)
        await a.leave()  # dropped while waiting
        await b.notice(1)  # b moved up at once
        again = rig.client("10.0.0.1")  # a reconnects within the grace period with its token
        again.start(example, "a", token=token)
        back = await again.notice(1)
        assert back.queue_token == token
        await b.notice(2)  # a has its old place back: in front of b
        rig.dit.capacity = 1
        assert isinstance(await again.answer(), FrameReply)
        await again.leave()
        await b.leave()
    asyncio.run(go())


def test_a_full_line_answers_busy_and_a_refusal_that_is_not_busy_ends_the_wait(example):
    async def go():
        rig = Rig(max_waiting=1)
        a, b = rig.client("10.0.0.1"), rig.client("10.0.0.2")
        a.start(example, "a")
        await a.notice(1)
        b.start(example, "b")
        refused = await b.answer()
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY and "waiting room is full" in \
            refused.message and refused.retry_after_s
        real_call = rig.dit.call

        async def too_large(method, args):
            if method == "reserve":
                raise TooLarge("the session needs more than the whole budget")
            return await real_call(method, args)
        rig.dit.call = too_large
        answer = await a.answer()
        assert isinstance(answer, ErrorReply) and answer.code is ErrorCode.TOO_LARGE
        assert len(rig.room._book) == 0  # it left the line
        await a.leave()
        await b.leave()
    asyncio.run(go())


def test_without_a_room_a_full_server_answers_busy_at_once(example):
    async def go():
        rig = Rig()
        backends = Backends(text=rig.backends.text, vae=rig.vae, dit=rig.dit)  # no waiting room
        rig.backends = backends
        a = rig.client()
        a.start(example, "a")
        answer = await a.answer()
        assert isinstance(answer, ErrorReply) and answer.code is ErrorCode.BUSY
        assert not [r for r in a.ws.sent if isinstance(r, Queued)]
        await a.leave()
    asyncio.run(go())


def test_a_waiting_session_counts_against_its_keys_session_quota(example):
    """Issue 46: the quotas per key apply to the line too: a key allowed one session cannot
    put a second one in line (on another socket) while its first waits."""
    from deployments.ingress.guards.quotas import KeyQuota  # noqa: PLC0415

    async def go():
        rig = Rig()
        quota = KeyQuota(None, 1)
        a, b = Client(rig, "10.0.0.1", quota), Client(rig, "10.0.0.2", quota)
        a.start(example, "a")
        await a.notice(1)
        b.start(example, "b")
        refused = await b.answer()
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY, refused
        assert len(rig.room._book) == 1  # only a waits
        await a.leave()
        await b.leave()
    asyncio.run(go())


def test_a_job_is_not_admitted_while_live_sessions_wait(example):
    """Issue 46, item 3: a job never takes the place a waiting live user needs. An offline
    session (a /v1/videos job's transport) gets `busy` while the line holds a live session, and
    is admitted once none waits; it never joins the line itself."""
    async def go():
        rig = Rig()
        live = rig.client("10.0.0.1")
        live.start(example, "live")
        await live.notice(1)
        job = rig.client("10.0.0.2")
        job.ws.offline = True  # what the videos runner's LocalTransport says
        job.start(example, "job")
        refused = await job.answer()
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY and "wait for a place" in \
            refused.message, refused
        assert len(rig.room._book) == 1 and not [r for r in job.ws.sent if isinstance(r, Queued)]
        await live.leave()  # the line is empty: the job's next try gets the place
        rig.dit.capacity = 1
        job.start(example, "job")
        assert isinstance((await job.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, FrameReply)]))[0],
                          FrameReply)
        await job.leave()
    asyncio.run(go())


def test_a_full_vae_keeps_the_session_in_line_and_gives_the_dit_reservation_back(example):
    """The DiT has room but the VAE has none (its byte budget): the first in line is not
    answered `busy` (as it was on the H100, issue 46's run): its DiT reservation goes back and
    it waits on; it starts once the VAE has room."""
    async def go():
        rig = Rig()
        rig.vae = Slots("vae", rig.log, 0.0)
        rig.vae.admits, rig.vae.shared = "open", True
        rig.backends = Backends(text=rig.backends.text, vae=rig.vae, dit=rig.dit, room=rig.backends.room)
        rig.dit.capacity = 1
        a = rig.client()
        a.start(example, "a")
        await a.notice(1)
        await asyncio.sleep(1.0)  # several tries: each reservation given back
        assert not [r for r in a.ws.sent if isinstance(r, (FrameReply, ErrorReply))]
        assert rig.dit.reserved == set() and len(rig.dit.closed) >= 1
        rig.vae.capacity = 1
        assert isinstance(await a.answer(), FrameReply)
        await a.leave()
    asyncio.run(go())
