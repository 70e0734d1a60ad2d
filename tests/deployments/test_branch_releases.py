"""Forks and rewinds pipelined, interleaved and cut off by the socket's end leave nothing on the
replicas (issue 43, items 1-2), against fake deployments that keep their sessions' keys as a
replica does (`SessionReplica`: an open of a key held raises "already open", a closed key is
never opened again). No Ray: the same moves through the real app are in test_disconnects.py."""
from __future__ import annotations

import asyncio
import io
import random
from collections import Counter

import numpy as np
from PIL import Image

from connection_fakes import FakeDeployment, FakeMetrics, ScriptedSocket, SessionReplica
from deployments.config import AppArgs
from deployments.ingress.connection import Backends, Connection
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, Forked, FrameReply, Rewound
from protocol.codec import encode
from protocol.messages import ResetRequest, ForkRequest, RewindRequest
from protocol.requests import SessionStart, infer_request

DIT_S = 0.02  # a fake DiT call; VAE calls take VAE_S
VAE_S = 0.01
POSES = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
INTRINSICS = np.tile(np.array([40.0, 40.0, 24.0, 16.0], np.float32), (12, 1))


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 36), (90, 120, 150)).save(buf, "PNG")
    return buf.getvalue()


IMAGE = png()


def infer(sid: str, first: bool = False) -> bytes:
    return encode(infer_request(sid, POSES, INTRINSICS, start=SessionStart(IMAGE, "a street") if first else None))


class Rig:
    """One Connection on session-keeping fakes; the socket leaves when the block ends, and the
    block waits for the connection's teardown."""

    # a random client's refused frames (a fork of a session it reset ...) may come many in a row
    def __init__(self, args: AppArgs = AppArgs(model={"default_size": "32*64"},
                                               connection={"max_refused_frames": 1000})) -> None:
        self.log: list[str] = []
        self.dit = SessionReplica("dit", self.log, DIT_S)
        self.vae = SessionReplica("vae", self.log, VAE_S)
        self.backends = Backends(text=FakeDeployment("text", self.log, 0.0), vae=self.vae, dit=self.dit)
        self.ws = ScriptedSocket()
        self.args = args

    async def __aenter__(self) -> "Rig":
        self.conn = Connection(self.ws, self.backends, self.args, Limits(), CameraServerConfig(model="tiny"),
                               FakeMetrics())
        self.task = asyncio.create_task(self.conn.run())
        return self

    async def __aexit__(self, *exc) -> None:
        self.ws.leave()
        await asyncio.wait_for(self.task, 30)

    def replies(self, kind: type) -> list:
        return [r for r in self.ws.sent if isinstance(r, kind)]

    async def count(self, kind: type, n: int, timeout: float = 10.0) -> list:
        """Until `n` replies of `kind` were sent; all of them."""
        return await self.ws.wait_for(lambda sent: len(self.replies(kind)) >= n and self.replies(kind), timeout)

    async def session(self, sid: str, chunks: int) -> None:
        """Open `sid` and stream `chunks` chunks, two in flight at a time, until their replies came."""
        frames_before = len(self.replies(FrameReply))
        for k in range(chunks):
            self.ws.send(infer(sid, first=k == 0))
            await self.count(FrameReply, frames_before + k - 1)
        await self.count(FrameReply, frames_before + chunks)

    def held(self) -> dict[str, set[str]]:
        return {"dit": set(self.dit.held), "vae": set(self.vae.held)}


def test_rewinds_sent_back_to_back_run_one_at_a_time_and_the_socket_end_frees_every_key():
    """Issue 43 item 1: eight rewinds without waiting for `rewound`. The first one is made; each
    other is refused `busy` while it rebuilds (nothing changed: send it again after `rewound`).
    No key is opened twice, and after the socket's end the replicas hold nothing."""
    async def go():
        async with Rig() as rig:
            await rig.session("s", 9)
            for k in range(8, 0, -1):
                rig.ws.send(encode(RewindRequest(session_id="s", to_chunk=k)))
            answers = await rig.ws.wait_for(
                lambda sent: len([r for r in sent if isinstance(r, (Rewound, ErrorReply))]) >= 8
                and [r for r in sent if isinstance(r, (Rewound, ErrorReply))])
            rig.ws.send(encode(RewindRequest(session_id="s", to_chunk=5)))  # after `rewound`: taken
            await rig.count(Rewound, 2)
            rig.ws.send(infer("s"))
            after = (await rig.count(FrameReply, 10))[-1]
        return rig, answers, after

    rig, answers, after = asyncio.run(go())
    assert isinstance(answers[0], Rewound) and answers[0].next_chunk_id == 8
    assert all(isinstance(a, ErrorReply) and a.code is ErrorCode.BUSY and a.retry_after_s for a in answers[1:])
    assert after.chunk_id == 5
    assert rig.dit.errors == [] and rig.vae.errors == []
    assert rig.held() == {"dit": set(), "vae": set()}


def test_a_rewind_rebuilds_what_the_session_had_when_it_was_queued():
    """An infer sent right after a rewind (not waiting for `rewound`) takes its chunk id before
    the rebuild runs: the VAE still replays the k chunks of the rewind, not k + 1."""
    async def go():
        async with Rig() as rig:
            await rig.session("s", 3)
            rig.vae.close_s = 0.1  # the rebuild waits behind the close of the old incarnation
            rig.ws.send(encode(RewindRequest(session_id="s", to_chunk=1)))
            rig.ws.send(infer("s"))
            again = (await rig.count(FrameReply, 4))[-1]
        return rig, again

    rig, again = asyncio.run(go())
    _options, _image, conditioned, decoded = rig.vae.restores[-1]
    assert (conditioned, len(decoded), again.chunk_id) == (1, 1, 1)


def test_rewinds_pipelined_then_the_socket_closes_leave_nothing_held():
    """Issue 43 item 1 as attacked: the rewinds, then the socket closes before any answer."""
    async def go():
        async with Rig() as rig:
            await rig.session("s", 9)
            for k in range(8, 0, -1):
                rig.ws.send(encode(RewindRequest(session_id="s", to_chunk=k)))
        return rig

    rig = asyncio.run(go())
    assert rig.dit.errors == [] and rig.vae.errors == []
    assert rig.held() == {"dit": set(), "vae": set()}


def test_a_rewind_racing_the_socket_end_closes_the_old_incarnation_too():
    """Issue 43 item 2: S (3 chunks), fork S -> F at the head, an infer on F, rewind S to 1, and
    the socket ends 20 ms later, while the rewind's close of S's old keys still waits on the
    lanes behind F's chunk. The teardown closes every incarnation's keys, old and new."""
    async def go():
        async with Rig() as rig:
            await rig.session("s", 3)
            rig.ws.send(encode(ForkRequest(session_id="s", new_session_id="f", at_chunk=3)))
            await rig.count(Forked, 1)
            rig.ws.send(infer("f"))
            rig.ws.send(encode(RewindRequest(session_id="s", to_chunk=1)))
            await asyncio.sleep(0.02)
        return rig

    rig = asyncio.run(go())
    assert len(set(rig.dit.opened)) >= 2 and len(set(rig.vae.opened)) >= 2  # S and F at least
    assert rig.held() == {"dit": set(), "vae": set()}


MOVES = ("infer", "infers", "fork", "fork", "rewind", "rewinds", "reset", "switch")


class Moves:
    """A random client of one socket: what it sent, and what it knows of its sessions from the
    replies so far (exact once every request was answered: `settle`)."""

    def __init__(self, rig: Rig, rng: random.Random, name: str) -> None:
        self.rig, self.rng, self.name = rig, rng, name
        self.sent = 0  # requests sent; each gets one reply
        self.chunks: dict[str, int] = {}  # session id -> its next chunk, as the replies say
        self.started: set[str] = set()  # sessions the server holds open, as far as the client knows
        self.log: list[str] = []

    def send(self, frame: bytes, what: str) -> None:
        self.rig.ws.send(frame)
        self.sent += 1
        self.log.append(what)

    def learn(self) -> None:
        for r in self.rig.ws.sent:
            if isinstance(r, FrameReply):
                self.chunks[r.session_id] = max(self.chunks.get(r.session_id, 0), r.chunk_id + 1)
            elif isinstance(r, (Rewound, Forked)):
                self.chunks[r.session_id] = r.next_chunk_id

    async def settle(self, timeout: float = 10.0) -> None:
        """Until every request was answered (the handshake is one reply more)."""
        await self.rig.ws.wait_for(lambda sent: len(sent) > self.sent, timeout)
        self.learn()

    def infer(self, sid: str) -> None:
        first = sid not in self.started
        self.started.add(sid)
        self.send(infer(sid, first=first), f"infer {sid}{' +image' if first else ''}")

    async def move(self) -> None:
        rng, sids = self.rng, sorted(self.started) or [self.name]
        move, sid = rng.choice(MOVES), rng.choice(sids)
        n = self.chunks.get(sid, 0)
        if move in ("infer", "infers", "switch"):
            for _ in range(rng.randint(2, 3) if move == "infers" else 1):
                self.infer(sid)
        elif move == "fork":
            new = f"{self.name}-f{len(self.log)}"
            self.send(encode(ForkRequest(session_id=sid, new_session_id=new, at_chunk=rng.randint(1, max(1, n)))),
                      f"fork {sid}->{new}")
            self.started.add(new)  # if refused, its first infer sends no image: missing_field, harmless
        elif move in ("rewind", "rewinds"):
            for _ in range(rng.randint(2, 4) if move == "rewinds" else 1):
                k = rng.randint(0, max(0, n - 1))
                self.send(encode(RewindRequest(session_id=sid, to_chunk=k)), f"rewind {sid} to {k}")
                n = k
        else:
            self.send(encode(ResetRequest(session_id=sid)), f"reset {sid}")
            self.started.discard(sid)
            self.chunks.pop(sid, None)


def test_random_forks_rewinds_and_drops_leave_nothing_held():
    """Seeded: 30 sockets, each a random sequence of up to 12 moves (infers pipelined or not,
    forks and rewinds at random chunks, several back to back, resets, switching sessions),
    each followed at random by a wait for every answer, a short pause or nothing; then the
    socket ends at a random moment. After each: no key opened twice, the replicas hold nothing."""
    rng = random.Random(43)
    seen: Counter = Counter()

    async def one(i: int) -> tuple[Rig, list[str]]:
        async with Rig() as rig:
            m = Moves(rig, rng, f"s{i}")
            m.infer(m.name)
            for _ in range(rng.randint(1, 12)):
                await m.move()
                wait = rng.random()
                if wait < 0.4:
                    await m.settle()
                elif wait < 0.7:
                    await asyncio.sleep(rng.uniform(0.0, 0.1))
            await asyncio.sleep(rng.uniform(0.0, 0.05))
        seen.update(type(r).__name__ for r in rig.ws.sent)
        return rig, m.log

    async def go():
        return [await one(i) for i in range(30)]

    for rig, moves in asyncio.run(go()):
        assert rig.dit.errors == [] and rig.vae.errors == [], moves
        assert rig.held() == {"dit": set(), "vae": set()}, moves
    assert seen["Rewound"] >= 5 and seen["Forked"] >= 3, seen  # the moves did branch
