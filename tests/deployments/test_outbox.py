"""Outbox: replies leave in the order they were put, whatever finishes first (no Ray)."""
from __future__ import annotations

import asyncio

import numpy as np
from starlette.websockets import WebSocketState

from deployments.ingress.journal import SessionJournal
from deployments.ingress.outbox import Outbox
from deployments.ingress.stream import Stream
from deployments.wire import SessionOptions
from protocol import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply

SPEC = SessionOptions(session_id="s", prompt="p", image_digest="d", resolution=(32, 48), seed=42,
                      total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))
IMAGE = np.zeros((16, 16, 3), np.uint8)


class Socket:
    application_state = WebSocketState.CONNECTED

    def __init__(self) -> None:
        self.sent: list = []

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(decode_reply(data))


def frame(chunk_id: int) -> FrameReply:
    return FrameReply(session_id="s", chunk_id=chunk_id, video=b"\0", num_frames=12, resolution=(32, 48))


def test_replies_leave_in_the_order_put_and_frame_replies_are_counted_once_sent():
    ws, sent, replies = Socket(), [], []
    stream = Stream(SPEC, SessionJournal(IMAGE, max_bytes=1 << 20), IMAGE)

    async def go() -> None:
        outbox = Outbox(ws, on_sent=lambda s, r: sent.append((s, r.chunk_id)), on_reply=lambda: replies.append(1))
        sender = asyncio.create_task(outbox.send_loop())
        slow, fast = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
        outbox.put(slow, stream)
        outbox.put(fast, stream)
        outbox.reply_now(ErrorReply(code=ErrorCode.BAD_MESSAGE, message="m", session_id="s"), stream)
        assert len(outbox) == 3
        fast.set_result(frame(1))  # the later chunk finishes first: it waits for the earlier one
        await asyncio.sleep(0.05)
        assert ws.sent == [] and sent == []
        slow.set_result(frame(0))
        await asyncio.wait_for(outbox.flush(5.0), 10.0)
        assert len(outbox) == 0
        sender.cancel()

    asyncio.run(go())
    assert [getattr(r, "chunk_id", r.type) for r in ws.sent] == [0, 1, "error"]
    assert sent == [(stream, 0), (stream, 1)]  # frame replies only; an error is not a chunk sent
    assert len(replies) == 3
