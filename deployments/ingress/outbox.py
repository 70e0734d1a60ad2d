"""Outbox: the one ordered way out of a `Connection` (connection.py).

Every reply, whatever finishes first, goes out in request order: the outbox holds a future per
reply, with the stream whose chunk it answers; once a frame reply of a stream is sent,
`on_sent` is told (resume.py counts what was sent), and `on_reply` after every reply (the
client policy counts the replies it owes). Notices that answer no request (`queued`: the
place in line of a session whose first chunk waits) go out at once, ahead of the replies
still being made (`notice`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional

from pydantic import BaseModel
from starlette.websockets import WebSocketState

from deployments.ingress.detached import retrieved
from deployments.ingress.stream import Stream
from deployments.ingress.transport import Transport
from protocol.codec import encode
from protocol.messages import FrameReply, Paused

OnSent = Callable[[Stream, FrameReply | Paused], None]


class Outbox:
    """Sends the replies of one connection in the order they were put."""

    def __init__(self, ws: Transport, on_sent: OnSent, on_reply: Callable[[], None]) -> None:
        self._ws = ws
        self._on_sent = on_sent
        self._on_reply = on_reply
        self._queue: asyncio.Queue[tuple[asyncio.Future[BaseModel], Optional[Stream]]] = asyncio.Queue()
        self._sending = asyncio.Lock()  # one frame at a time on the socket: the loop's and the notices'
        self._notices: set[asyncio.Task] = set()

    def __len__(self) -> int:
        """Replies queued and not yet sent."""
        return self._queue.qsize()

    def put(self, reply: asyncio.Future[BaseModel], stream: Optional[Stream] = None) -> None:
        """Queue a reply still being made; `stream`: the stream whose chunk it answers."""
        self._queue.put_nowait((reply, stream))

    def reply_now(self, reply: BaseModel, stream: Optional[Stream] = None) -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        self._queue.put_nowait((fut, stream))

    def notice(self, reply: BaseModel) -> None:
        """Send `reply` now, out of the replies' order (it answers no request)."""
        async def send() -> None:
            async with self._sending:
                if self._ws.application_state is WebSocketState.CONNECTED:
                    await self._ws.send_bytes(encode(reply))
        task = asyncio.get_running_loop().create_task(send())
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)
        task.add_done_callback(retrieved)  # a send that failed: the client is gone (the receive loop sees it)

    async def send_loop(self) -> None:
        while True:
            fut, stream = await self._queue.get()
            reply = await asyncio.shield(fut)  # the sender's cancel (socket end) must not cancel a chunk (resume)
            async with self._sending:
                await self._ws.send_bytes(encode(reply))
            if stream is not None and isinstance(reply, (FrameReply, Paused)):  # (a driven stream's pause)
                self._on_sent(stream, reply)
            self._queue.task_done()
            self._on_reply()

    async def flush(self, timeout_s: float) -> None:
        """Wait (bounded) until the replies queued so far are sent."""
        await asyncio.wait({asyncio.ensure_future(self._queue.join())}, timeout=timeout_s)

    async def close_socket(self, code: int, reason: str) -> None:
        if self._ws.application_state is WebSocketState.CONNECTED:
            await self._ws.close(code=code, reason=reason)
