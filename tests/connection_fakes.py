"""Fakes for driving one `Connection` without Ray: recording deployments, a socket, metrics."""
from __future__ import annotations

import asyncio

import numpy as np
from starlette.websockets import WebSocketState

from deployments.wire import NoiseSnapshot, StepResult
from protocol import decode_reply


class FakeDeployment:
    """Records calls; checks that one connection never has two calls in flight to it (`shared`:
    several connections use it, whose calls may overlap)."""

    shared = False

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
        assert self.shared or self.in_flight == 0, f"two calls in flight to {self.name}"
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

    def observe_session_fps(self, fps) -> None:
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


class SessionReplica(FakeDeployment):
    """A deployment that keeps its sessions' keys as a replica's session table does: `open`,
    `restore`, `clone` (the new key: its second argument) and `reserve` take a key (an `open` or
    `restore` then claims a reservation), `close` frees it and remembers it. Like the replica: a
    key taken again raises AssertionError "already open" (also recorded in `errors`), a closed
    key cannot be opened again (`SessionLost`), a call of a key not held answers `SessionLost`.
    `close` and `expect_release` come at any time (a teardown closes at once: not counted as in
    flight); `close_s`: how long a close takes. `refuse`: admissions answer `Busy` (a full replica)."""

    OPENS = frozenset({"open", "restore", "clone", "reserve"})

    def __init__(self, name: str, log: list[str], seconds: float, refuse: bool = False, close_s: float = 0.0) -> None:
        super().__init__(name, log, seconds)
        self.close_s = close_s
        self.held: set[str] = set()
        self.reserved: set[str] = set()
        self.closed: set[str] = set()
        self.opened: list[str] = []  # every key ever taken, in order
        self.restores: list[tuple] = []  # the arguments of each `restore` after its key
        self.errors: list[str] = []
        self.refuse = refuse
        self.ends_needed = 1  # what its `Busy` says must end first (the frame-rate floor's: more)

    async def call(self, method: str, args: tuple):
        from deployments.errors import Busy, SessionLost  # noqa: PLC0415

        if method == "close":
            key = args[0]
            self.log.append(f"{self.name}.close")
            await asyncio.sleep(self.close_s)
            self.closed.add(key)
            self.reserved.discard(key)
            was = key in self.held
            self.held.discard(key)
            return was
        if method in ("expect_release", "preempt"):
            return False
        key = args[1] if method == "clone" else args[0]
        if method == "restore":
            self.restores.append(args[1:])
        if method in self.OPENS:
            if key in self.closed:
                raise SessionLost(f"session {key} was closed")
            if method in ("open", "restore") and key in self.reserved:
                self.reserved.discard(key)  # its reservation claimed
            elif key in self.held:
                self.errors.append(f"{method} {key}")
                raise AssertionError(f"session {key} is already open")
            else:
                if self.refuse:
                    raise Busy(f"all session slots of {self.name} are taken", 1.0, self.ends_needed)
                self.held.add(key)
                self.opened.append(key)
                if method == "reserve":
                    self.reserved.add(key)
        elif method not in ("encode",) and key not in self.held:
            raise SessionLost(f"{self.name} does not hold session {key}")
        return await super().call(method, args)


class ReplicaHandle:
    """A deployment handle's call shape (`.method.remote(...)`) over a replica object."""

    def __init__(self, replica) -> None:
        self._replica = replica

    def __getattr__(self, method: str):
        target = getattr(self._replica, method)

        class Method:
            @staticmethod
            def remote(*args):
                return target(*args)

        return Method
