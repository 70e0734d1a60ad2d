"""A viewer's socket on the watch route and the owner's `share`, for the Ray tests of shared
worlds' players (tests/deployments/test_sharing_players.py; test_sharing.py keeps its own)."""
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
    """A viewer's socket: `watch`, then frame replies, notices and errors."""

    def __init__(self, ws) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, server, world_id: str, token: str, headers: dict | None = None):
        ws = await websockets.connect(watch_url(server), max_size=None, additional_headers=headers)
        await ws.send(encode(WatchRequest(world_id=world_id, watch_token=token)))
        return cls(ws), decode_reply(await asyncio.wait_for(ws.recv(), 30))

    async def next(self, timeout: float = 60.0):
        return decode_reply(await asyncio.wait_for(self.ws.recv(), timeout))

    async def frame(self, timeout: float = 60.0) -> FrameReply:
        while not isinstance(reply := await self.next(timeout), FrameReply):
            pass
        return reply

    async def error(self, timeout: float = 60.0) -> ErrorReply:
        while not isinstance(reply := await self.next(timeout), ErrorReply):
            pass
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
