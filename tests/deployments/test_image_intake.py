"""Session images are decoded off the ingress's event loop, a bounded number at a time (issue 31:
four 8192x4096 PNGs of 108 KB each stalled the ingress 12 s and `/healthz` answered 503)."""
from __future__ import annotations

import asyncio
import threading
import time

from PIL import Image

from deployments.config import AppArgs
from deployments.ingress.connection import Backends, Connection
from deployments.ingress.image_intake import DECODE_THREADS
from protocol import decode_reply
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from connection_fakes import FakeDeployment, FakeMetrics, FakeSocket


def _serve(frames: list[list[bytes]]) -> list[FakeSocket]:
    """One Connection per list of frames, all at once, against fake deployments."""
    log: list[str] = []
    args = AppArgs()

    async def one(ws: FakeSocket) -> None:
        backends = Backends(text=FakeDeployment("text", log, 0.0), vae=FakeDeployment("vae", log, 0.0),
                            dit=FakeDeployment("dit", log, 0.0))
        conn = Connection(ws, backends, args, Limits(), CameraServerConfig(model="tiny"), FakeMetrics())
        await asyncio.wait_for(conn.run(), 60)

    sockets = [FakeSocket(f) for f in frames]
    for ws in sockets:  # one reply after the handshake, then the client leaves
        ws.send_bytes = _leave_after(ws, 2)

    async def go() -> None:
        await asyncio.gather(*(one(ws) for ws in sockets))

    asyncio.run(go())
    return sockets


def _leave_after(ws: FakeSocket, replies: int):
    async def send_bytes(data: bytes) -> None:
        ws.sent.append(decode_reply(data))
        if len(ws.sent) == replies:
            ws.inbox.put_nowait({"type": "websocket.disconnect"})
    return send_bytes


def test_images_decode_in_worker_threads_a_bounded_number_at_a_time(example, monkeypatch):
    loop_threads: set[int] = set()
    decode_threads: list[int] = []
    running, most = 0, 0
    lock = threading.Lock()
    convert = Image.Image.convert

    def slow_convert(self, *args, **kwargs):  # the pixel decode of protocol.image.decode_image
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            decode_threads.append(threading.get_ident())
        try:
            time.sleep(0.2)
            return convert(self, *args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(Image.Image, "convert", slow_convert)
    poses, intrinsics = example.chunk(0)
    sockets = 2 * DECODE_THREADS + 1
    frames = [[encode(infer_request(f"s{i}", poses, intrinsics, start=SessionStart(example.image, "p", num_frames=9)))]
              for i in range(sockets)]

    real_run = Connection.run

    async def run(self):
        loop_threads.add(threading.get_ident())
        await real_run(self)

    monkeypatch.setattr(Connection, "run", run)
    done = _serve(frames)
    assert all(isinstance(ws.sent[1], FrameReply) for ws in done), [ws.sent[1:] for ws in done]
    assert len(decode_threads) == sockets and not loop_threads & set(decode_threads), \
        "an image was decoded on the event loop"
    assert most <= DECODE_THREADS, most
