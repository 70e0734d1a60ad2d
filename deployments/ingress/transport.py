"""Transport: what a `Connection` needs of its client's socket, and an in-process one.

A Connection receives ASGI WebSocket messages (`{"type": "websocket.receive", "bytes": ...}`,
`{"type": "websocket.disconnect", ...}`), sends binary replies and closes with a code and a
reason. Starlette's `WebSocket` is one transport (the camera route). `LocalTransport` is the
other: the offline endpoint (`POST /v1/videos`) pushes a session's requests through it and
reads the replies, so that its video runs through the very code that serves the WebSocket.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Optional, Protocol

from starlette.websockets import WebSocketState

from deployments.proxy_guard import DROPPED_FRAME_BYTES
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits

NORMAL_CLOSURE = 1000


def frame_size(msg: dict[str, Any]) -> int:
    """The bytes of a received frame, also of one the proxy guard kept back (deployments/proxy_guard.py)."""
    return msg.get(DROPPED_FRAME_BYTES) or len(msg.get("bytes") or b"") or len(msg.get("text") or "")


def oversize(msg: dict[str, Any], limits: Limits) -> Optional[ProtocolError]:
    """The typed too_large for a frame over `max_message_bytes` that the proxy guard kept back
    (the same refusal as `protocol.codec.decode` gives the frame itself), else None."""
    size = msg.get(DROPPED_FRAME_BYTES)
    if not size:
        return None
    return ProtocolError(ErrorCode.TOO_LARGE, f"message is {size} bytes; at most {limits.max_message_bytes}")


class Transport(Protocol):
    """The part of Starlette's `WebSocket` a Connection uses."""

    application_state: WebSocketState
    # Optional `raw_frames: bool` (read with getattr, default False): sessions opened on this
    # transport get raw RGB uint8 frames in `FrameReply.video` instead of fMP4 (deployments/clip).
    # Optional `offline: bool` (likewise): its sessions are offline (`SessionOptions.offline`: a
    # `/v1/videos` job, nobody watching live; the replicas serve the live sessions first).

    async def receive(self) -> dict[str, Any]: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int = NORMAL_CLOSURE, reason: Optional[str] = None) -> None: ...


def session_traits(transport: Transport) -> dict[str, bool]:
    """What the sessions opened on `transport` are (`session_options`' keywords): its optional
    `raw_frames` and `offline` attributes, False when it has none."""
    return {"raw_frames": bool(getattr(transport, "raw_frames", False)),
            "offline": bool(getattr(transport, "offline", False))}


class TransportClosed(Exception):
    """The Connection closed the transport (a policy violation or a fatal error)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"closed by the server ({code}: {reason})")
        self.code, self.reason = code, reason


class LocalTransport:
    """An accepted in-process socket: `push` frames in, `reply()` reads what the Connection
    sent, `hang_up` is the client leaving. `offline`: its sessions are offline ones (a
    `/v1/videos` job's, videos/runner.py)."""

    def __init__(self, offline: bool = False) -> None:
        self.application_state = WebSocketState.CONNECTED
        self.offline = offline
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[bytes | TransportClosed] = asyncio.Queue()

    # ---- the Connection's side ----

    async def receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        self._outbox.put_nowait(data)

    async def close(self, code: int = NORMAL_CLOSURE, reason: Optional[str] = None) -> None:
        self.application_state = WebSocketState.DISCONNECTED
        self._outbox.put_nowait(TransportClosed(code, reason or ""))

    # ---- the client's side ----

    def push(self, data: bytes) -> None:
        """Send one binary frame to the Connection."""
        self._inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    async def reply(self, timeout_s: Optional[float] = None) -> bytes:
        """The next frame the Connection sent; `TransportClosed` once it closed."""
        async with asyncio.timeout(timeout_s):  # not wait_for: 3.11's can drop a cancellation
            item = await self._outbox.get()
        if isinstance(item, TransportClosed):
            self._outbox.put_nowait(item)  # closed for good: every later read says so
            raise item
        return item

    def hang_up(self) -> None:
        """The client leaves: the Connection's receive loop ends and it releases its sessions."""
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": NORMAL_CLOSURE})


async def next_message(ws: Transport, wait_s: Callable[[], Optional[float]]) -> Optional[dict[str, Any]]:
    """`ws`'s next ASGI message; None when the client stayed silent too long: `wait_s()` is how
    long to wait now (ClientPolicy.wait_s), None once the silence is over its bound."""
    receive = asyncio.ensure_future(ws.receive())
    try:
        while (wait := wait_s()) is not None:
            done, _ = await asyncio.wait({receive}, timeout=wait)
            if done:
                return receive.result()
        return None
    finally:
        receive.cancel()  # no-op once done
