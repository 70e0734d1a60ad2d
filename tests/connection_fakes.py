"""Fakes for driving one `Connection` without Ray: recording deployments, a socket, metrics."""
from __future__ import annotations

import asyncio

import numpy as np
from starlette.websockets import WebSocketState

from deployments.wire import NoiseSnapshot, StepResult
from protocol import decode_reply


class FakeDeployment:
    """Records calls; checks that one connection never has two calls in flight to it."""

    def __init__(self, name: str, log: list[str], seconds: float) -> None:
        self.name, self.log, self.seconds = name, log, seconds
        self.in_flight = 0

    def options(self, session_id: str) -> "FakeDeployment":
        assert session_id, "every call carries the session key"
        return self

    def __getattr__(self, method: str):
        deployment = self

        class Method:
            @staticmethod
            def remote(*args):
                return deployment.call(method, args)

        return Method

    async def call(self, method: str, args: tuple):
        assert self.in_flight == 0, f"two calls in flight to {self.name}"
        self.in_flight += 1
        self.log.append(f"{self.name}.{method} start")
        await asyncio.sleep(self.seconds)
        self.log.append(f"{self.name}.{method} end")
        self.in_flight -= 1
        if method == "step":
            return StepResult(latents=np.zeros((16, 3, 4, 6), np.float32),
                              noise=NoiseSnapshot(np.zeros(8, np.uint8), False), timings={"dit": self.seconds},
                              replica="d")
        if method == "decode":
            return {"video": b"\0\0\0\x08moof", "num_frames": 12, "mime_type": "video/mp4",
                    "timings": {"vae_decode": self.seconds, "mux": 0.0}, "replica": "v"}
        if method == "encode":
            return np.zeros((4, 64), np.float32)
        return "r" if method == "open" else None


class FakeSocket:
    def __init__(self, frames: list[bytes]) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        for f in frames:
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": f})
        self.sent: list = []
        self.application_state = WebSocketState.CONNECTED

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(decode_reply(data))
        if len(self.sent) == 4:  # handshake + 3 frames: the client leaves
            self.inbox.put_nowait({"type": "websocket.disconnect"})


class FakeMetrics:
    def observe_chunk(self, durations) -> None:
        pass

    def count_error(self, code) -> None:
        pass

    def count_recovery(self, deployment, rebuilt) -> None:
        pass

    def connection_released(self) -> None:
        pass


class ScriptedSocket:
    """A socket a test talks through while the Connection runs: `send` frames in, `sent` replies
    out (decoded), `wait_for` a condition on them."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.sent: list = []
        self.application_state = WebSocketState.CONNECTED
        self._changed = asyncio.Event()

    def send(self, frame: bytes) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "bytes": frame})

    def leave(self) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect"})

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(decode_reply(data))
        self._changed.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.application_state = WebSocketState.DISCONNECTED

    async def wait_for(self, predicate, timeout: float = 10.0):
        """Until `predicate(sent)` is truthy; returns it."""
        async def wait():
            while not (result := predicate(self.sent)):
                self._changed.clear()
                await self._changed.wait()
            return result
        return await asyncio.wait_for(wait(), timeout)
