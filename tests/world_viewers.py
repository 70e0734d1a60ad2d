"""A viewer's socket on the watch route and the owner's `share`, for the Ray tests of shared
worlds (tests/deployments/test_sharing.py, test_sharing_players.py, test_sharing_watch.py)."""
from __future__ import annotations

import asyncio

import websockets

from protocol import decode_reply
from protocol.codec import encode
from protocol.messages import ErrorReply, FrameReply, ShareRequest
from protocol.sharing import Shared, WatchRequest, WorldNotice

WATCH_PATH = "/v1/realtime/world/watch"


def watch_url(server) -> str:
    return server.ws.replace("/v1/realtime/world/camera", WATCH_PATH)


class Viewer:
    """A viewer's socket: `watch`, then frame replies, notices and errors (kept in `frames`
    and `notices` as they are read)."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.frames: list[FrameReply] = []
        self.notices: list[WorldNotice] = []

    @classmethod
    async def open(cls, server, world_id: str, token: str, headers: dict | None = None, catch_up: int = 0):
        """(the viewer, its first reply: `watching` or the refusal)."""
        ws = await websockets.connect(watch_url(server), max_size=None, additional_headers=headers)
        try:
            await ws.send(encode(WatchRequest(world_id=world_id, watch_token=token, catch_up=catch_up)))
        except websockets.ConnectionClosed:  # refused at connect (no key): its error came before the close
            pass
        return cls(ws), decode_reply(await asyncio.wait_for(ws.recv(), 30))

    async def next(self, timeout: float = 60.0):
        reply = decode_reply(await asyncio.wait_for(self.ws.recv(), timeout))
        (self.frames if isinstance(reply, FrameReply) else self.notices).append(reply)
        return reply

    async def frame(self, timeout: float = 60.0) -> FrameReply:
        while not isinstance(reply := await self.next(timeout), FrameReply):
            pass
        return reply

    async def error(self, timeout: float = 60.0, frames_ok: bool = True) -> ErrorReply:
        """The next error; `frames_ok=False`: only notices may come before it (no chunk was
        made meanwhile)."""
        while not isinstance(reply := await self.next(timeout), ErrorReply):
            assert frames_ok or isinstance(reply, WorldNotice), reply
        return reply

    async def event(self, event: str, timeout: float = 60.0) -> WorldNotice:
        while not (isinstance(reply := await self.next(timeout), WorldNotice) and reply.event == event):
            pass
        return reply


async def share(client, sid: str, **fields) -> Shared:
    await client.send(encode(ShareRequest(session_id=sid, **fields)))
    reply = await client.recv()
    assert isinstance(reply, Shared), reply
    return reply
