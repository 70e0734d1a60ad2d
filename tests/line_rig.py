"""The waiting line's rig without Ray (tests/deployments/test_line_hostile.py, test_line_regain.py):
fake model deployments, a DiT of a settable number of session slots, and clients that are real
`Connection`s on scripted sockets."""
from __future__ import annotations

import asyncio

from deployments.config import AppArgs, SessionArgs
from deployments.ingress.connection import Backends, Connection
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, Queued
from connection_fakes import FakeDeployment, FakeMetrics, ScriptedSocket, SessionReplica


class Slots(SessionReplica):
    """A DiT of `capacity` sessions: a `reserve` beyond them answers `busy`."""

    capacity = 0

    async def call(self, method: str, args: tuple):
        if method == "reserve":
            self.refuse = len(self.held) >= self.capacity
        return await super().call(method, args)


def fakes(shared: bool = True) -> tuple[list[str], Slots, SessionReplica, FakeDeployment]:
    """(the calls' log, the DiT (no slot until its `capacity` is set), the VAE, the text encoder);
    `shared`: several connections call them, their calls may overlap."""
    log: list[str] = []
    dit, vae, text = Slots("dit", log, 0.0), SessionReplica("vae", log, 0.0), FakeDeployment("text", log, 0.0)
    for d in (dit, vae, text):
        d.shared = shared
    return log, dit, vae, text


class LineClient:
    """A real Connection from `address` on a scripted socket; its sessions are parked when it
    leaves (resumable)."""

    NOTICE_TIMEOUT_S = 10.0

    def __init__(self, backends: Backends, sessions: SessionArgs, address: str) -> None:
        self.ws = ScriptedSocket()
        conn = Connection(self.ws, backends, AppArgs(sessions=sessions), Limits(), CameraServerConfig(model="tiny"),
                          FakeMetrics(), client=address, resumable=True)
        self.run = asyncio.ensure_future(conn.run())

    async def notice(self, position: int, after: int = 0) -> Queued:
        """The last `queued` notice at `position` among those sent from the `after`-th reply on."""
        found = await self.ws.wait_for(lambda sent: [r for r in sent[after:] if isinstance(r, Queued)
                                                     and r.position == position], timeout=self.NOTICE_TIMEOUT_S)
        return found[-1]

    async def leave(self) -> None:
        self.ws.leave()
        await asyncio.wait_for(self.run, 30)
