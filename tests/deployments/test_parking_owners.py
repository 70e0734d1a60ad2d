"""Without auth, parked sessions belong to their client address (issue 43, item 6): before, every
anonymous session was parked under one principal, so an infer without image for another
address's parked id answered `unauthorized "... waits to be resumed"` where an unknown id answers
`missing_field` (parked ids leaked across addresses), and a client's own fork named like another
address's parked session was refused. Connections on fake model deployments and the parking's
replica class (no Ray)."""
from __future__ import annotations

import asyncio
import msgpack

from deployments.config import AppArgs, SessionArgs
from deployments.ingress.connection import Backends, Connection
from deployments.ingress.parking import SessionParking
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from connection_fakes import FakeDeployment, FakeMetrics, ReplicaHandle, ScriptedSocket

A, B = "10.0.0.1", "10.0.0.2"


class Client:
    """One socket of a client address to a Connection that runs meanwhile."""

    def __init__(self, backends: Backends, address: str) -> None:
        self.ws = ScriptedSocket()
        conn = Connection(self.ws, backends, AppArgs(), Limits(), CameraServerConfig(model="tiny"), FakeMetrics(),
                          client=address, resumable=True)
        self.run = asyncio.ensure_future(conn.run())

    async def ask(self, frame: bytes):
        """Send `frame`; its answer (the next reply that is a frame, an error or a `forked`)."""
        seen = len(self.ws.sent)
        self.ws.send(frame)
        return (await self.ws.wait_for(lambda sent: sent[seen:] and [
            r for r in sent[seen:] if isinstance(r, (FrameReply, ErrorReply)) or getattr(r, "type", "") == "forked"]
        ))[0]

    async def leave(self) -> None:
        self.ws.leave()
        await asyncio.wait_for(self.run, 30)


def _infer(example, sid: str, k: int, first: bool) -> bytes:
    poses, intrinsics = example.chunk(k)
    extra = SessionStart(example.image, "p", num_frames=81) if first else None
    return encode(infer_request(sid, poses, intrinsics, start=extra))


def _fork(sid: str, new: str, at: int) -> bytes:
    return msgpack.packb({"endpoint": "fork", "session_id": sid, "new_session_id": new, "at_chunk": at})


async def _parked_by_a(backends: Backends, example) -> str:
    """Address A streams session "walk" and drops its socket: parked; its resume token."""
    a = Client(backends, A)
    reply = await a.ask(_infer(example, "walk", 0, True))
    assert isinstance(reply, FrameReply) and reply.resume_token
    await a.leave()
    return reply.resume_token


def _backends(parking) -> Backends:
    log: list[str] = []
    return Backends(text=FakeDeployment("text", log, 0.0), vae=FakeDeployment("vae", log, 0.0),
                    dit=FakeDeployment("dit", log, 0.0), parking=ReplicaHandle(parking))


def _parking() -> SessionParking:
    log: list[str] = []
    return SessionParking.func_or_class(FakeDeployment("vae", log, 0.0), FakeDeployment("dit", log, 0.0),
                                        SessionArgs())


def test_another_addresss_parked_id_looks_like_an_unknown_one(example):
    async def go():
        backends = _backends(_parking())
        await _parked_by_a(backends, example)
        b = Client(backends, B)
        foreign = await b.ask(_infer(example, "walk", 1, False))
        unknown = await b.ask(_infer(example, "nothing", 1, False))
        await b.leave()
        a = Client(backends, A)
        own = await a.ask(_infer(example, "walk", 1, False))  # its own address is told it waits
        await a.leave()
        return foreign, unknown, own

    foreign, unknown, own = asyncio.run(go())
    print(f"RELIABILITY parking, no auth: another address's parked id -> {foreign.code.value}, an unknown id -> "
          f"{unknown.code.value}, the owner's address -> {own.code.value}")
    assert isinstance(foreign, ErrorReply) and isinstance(unknown, ErrorReply)
    assert foreign.code == unknown.code == "missing_field"
    assert foreign.message.replace("walk", "X") == unknown.message.replace("nothing", "X")
    assert isinstance(own, ErrorReply) and own.code == "unauthorized" and "waits to be resumed" in own.message


def test_a_client_names_its_own_fork_like_another_addresss_parked_session(example):
    async def go():
        backends = _backends(_parking())
        await _parked_by_a(backends, example)
        b = Client(backends, B)
        first = await b.ask(_infer(example, "mine", 0, True))
        forked = await b.ask(_fork("mine", "walk", 1))
        chunk = await b.ask(_infer(example, "walk", 1, False))  # its own fork, named like A's parked one
        await b.leave()
        return first, forked, chunk

    first, forked, chunk = asyncio.run(go())
    assert isinstance(first, FrameReply) and getattr(forked, "type", "") == "forked"
    assert isinstance(chunk, FrameReply) and (chunk.session_id, chunk.chunk_id) == ("walk", 1), chunk


def test_the_owner_still_resumes_and_another_address_cannot_with_the_token(example):
    async def go():
        backends = _backends(_parking())
        token = await _parked_by_a(backends, example)
        resume = msgpack.packb({"endpoint": "resume", "session_id": "walk", "resume_token": token})
        b = Client(backends, B)
        stolen = await b.ask(resume)
        await b.leave()
        a = Client(backends, A)
        seen = len(a.ws.sent)
        a.ws.send(resume)
        resumed = await a.ws.wait_for(lambda sent: [r for r in sent[seen:] if getattr(r, "type", "") in (
            "resumed", "error")])
        await a.leave()
        return stolen, resumed[0]

    stolen, resumed = asyncio.run(go())
    assert isinstance(stolen, ErrorReply) and stolen.code == "unauthorized"
    assert getattr(resumed, "type", "") == "resumed", resumed

