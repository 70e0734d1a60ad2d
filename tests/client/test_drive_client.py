"""WorldClient's side of `drive` (client/session.py) on a recording socket: what drive(),
control() and ack() send, and receive()'s auto-ack of a driven session's frames."""
from __future__ import annotations

import asyncio
import io

import numpy as np
from PIL import Image

from client.session import WorldClient
from protocol import AckRequest, ControlRequest, DriveRequest, Paused, ResetRequest, decode, encode
from protocol.messages import CameraServerConfig, FrameReply
from protocol.requests import SessionStart
from scripted_server import video


class RecordingSocket:
    def __init__(self, replies) -> None:
        self.sent: list = []
        self.replies = list(replies)

    async def send(self, data: bytes) -> None:
        self.sent.append(decode(data))

    async def recv(self) -> bytes:
        return encode(self.replies.pop(0))

    async def close(self) -> None:
        pass


def frame(sid: str, k: int) -> FrameReply:
    frames = 9 if k == 0 else 12
    return FrameReply(session_id=sid, chunk_id=k, video=video(k, frames), num_frames=frames, resolution=(32, 48),
                      event_id=1, poses=np.eye(4, dtype=np.float32)[None].repeat(12, 0))


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 36)).save(buf, "PNG")
    return buf.getvalue()


def test_drive_control_and_auto_ack():
    ws = RecordingSocket([frame("d", 0), Paused(session_id="d", next_chunk_id=1), frame("m", 0), frame("d", 1)])

    async def go():
        c = WorldClient(ws, CameraServerConfig(model="tiny"))
        await c.drive("d", SessionStart(png(), "a street", seed=3))
        first = await c.control("d", ["W"])
        second = await c.control("d", [], event_id=41)
        third = await c.control("d", ["l"])
        await c.drive("m", SessionStart(png(), "manual"), auto_ack=False)
        got = [await c.receive() for _ in range(3)]
        await c.send_reset("d")
        got.append(await c.receive())  # after the reset: no ack
        return first, second, third, got

    first, second, third, got = asyncio.run(go())
    assert (first, second, third) == (1, 41, 2)
    kinds = [type(m).__name__ for m in ws.sent]
    assert kinds == ["DriveRequest", "ControlRequest", "ControlRequest", "ControlRequest", "DriveRequest",
                     "AckRequest", "ResetRequest"]
    drive, ack = ws.sent[0], ws.sent[5]
    assert isinstance(drive, DriveRequest) and drive.seed == 3 and drive.prompt == "a street"
    assert [m.keys for m in ws.sent[1:4] if isinstance(m, ControlRequest)] == [("w",), (), ("l",)]
    assert isinstance(ack, AckRequest) and (ack.session_id, ack.chunk_id) == ("d", 0)  # frame "m" 0: not driven
    assert isinstance(ws.sent[6], ResetRequest)
    assert [type(r).__name__ for r in got] == ["FrameReply", "Paused", "FrameReply", "FrameReply"]
