"""The one ordered outbox of a `Connection` (connection.py): every reply, whatever finishes
first, goes out in request order. It holds a future per reply, with the stream whose chunk it
answers (resume.py counts what was sent). `Outbox` is a base class of `Connection`, which sets
the attributes it declares.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from pydantic import BaseModel
from starlette.websockets import WebSocketState

from deployments.ingress.guards.client_policy import ClientPolicy
from deployments.ingress.stream import Stream
from deployments.ingress.transport import Transport
from protocol.codec import encode
from protocol.messages import FrameReply


class Outbox:
    """Sends the replies of one connection in order (a mixin of `Connection`)."""

    _ws: Transport
    _policy: ClientPolicy
    _outbox: asyncio.Queue[tuple[asyncio.Future[BaseModel], Optional[Stream]]]
    _sent: Any  # Resume: a frame reply of a stream was sent

    def _reply_now(self, reply: BaseModel, stream: Optional[Stream] = None) -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        self._outbox.put_nowait((fut, stream))

    async def _send_loop(self) -> None:
        while True:
            fut, stream = await self._outbox.get()
            reply = await asyncio.shield(fut)  # the sender's cancel (socket end) must not cancel a chunk (resume)
            await self._ws.send_bytes(encode(reply))
            if stream is not None and isinstance(reply, FrameReply):
                self._sent(stream, reply)
            self._outbox.task_done()
            self._policy.on_reply()

    async def _flush_replies(self, timeout_s: float) -> None:
        """Wait (bounded) until the replies queued so far are sent."""
        await asyncio.wait({asyncio.ensure_future(self._outbox.join())}, timeout=timeout_s)

    async def _close_socket(self, code: int, reason: str) -> None:
        if self._ws.application_state is WebSocketState.CONNECTED:
            await self._ws.close(code=code, reason=reason)
