"""ProxyGuard: the byte budget of each WebSocket, enforced inside Serve's HTTP proxy.

Serve's proxy reads client frames as fast as they come (no back-pressure) onto an unbounded
queue, and the ingress replica pulls them through the object store onto another; uvicorn's
frame limit (16 MiB) and permessage-deflate cannot be set through Serve. Four sockets sending
15 MiB frames of zeros (a few KB each on the wire) made the proxy and the ingress peak at
~3 GB each, ~1.1 GB staying, before the ingress's own byte budget saw a frame.

This ASGI middleware runs in the proxy process, in front of every route, and on each WebSocket:

* counts the bytes of every client frame against a token bucket (`LWF_PROXY_MAX_BYTES_PER_S`
  sustained, `LWF_PROXY_BYTES_BURST` at once; the defaults are AppArgs.connection's): a frame
  beyond it closes the socket (1008) at once, and the frame goes nowhere;
* keeps back a frame over `LWF_PROXY_MAX_FRAME_BYTES` (default: the default max_message_bytes):
  the ingress gets a stub naming its size (`DROPPED_FRAME_BYTES`) and answers the typed
  too_large, as it would for the frame itself; the socket stays usable. The frame's payload is
  never held: the websockets parser drops it as it arrives (`skip_large_frames`).

The callback also turns permessage-deflate off in the proxy's uvicorn (`no_deflate`; Serve
has no option for it): a frame of zeros deflates to a few KB, so a client could make the proxy
inflate 15 MiB frames, several per TCP read and on its event loop, faster than it can read them
(measured with the budget alone: closes 10-40 s late, handshakes of others 25 s). Without it
each frame costs its own size on the wire, and uvicorn stops reading a socket while one of its
frames waits for the app.

Serve loads it from `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` (`PROXY_GUARD_ENV`), read by
the proxy actor when it starts: set it in the environment that starts Ray (every node), as the
k8s manifests do; a Serve config file cannot set the proxy's environment.
"""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from typing import Any

from starlette.middleware import Middleware

from deployments.config import DEFAULT_MAX_MESSAGE_BYTES, ConnectionArgs
from deployments.ingress.guards.quotas import TokenBucket

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DROPPED_FRAME_BYTES = "lwf_dropped_frame_bytes"  # key of a stub `websocket.receive`: the size kept back
POLICY_VIOLATION = 1008
MAX_BYTES_PER_S_ENV = "LWF_PROXY_MAX_BYTES_PER_S"
BYTES_BURST_ENV = "LWF_PROXY_BYTES_BURST"
MAX_FRAME_BYTES_ENV = "LWF_PROXY_MAX_FRAME_BYTES"
PROXY_GUARD_ENV = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "deployments.proxy_guard:middlewares"}

log = logging.getLogger("ray.serve")


class ProxyGuard:
    """Pure ASGI middleware: a `_SocketGuard` around each WebSocket, HTTP untouched."""

    def __init__(self, app: Callable, max_bytes_per_s: float, bytes_burst: int, max_frame_bytes: int) -> None:
        if bytes_burst < max_frame_bytes:
            raise ValueError(f"{BYTES_BURST_ENV} ({bytes_burst}) must be at least {MAX_FRAME_BYTES_ENV} "
                             f"({max_frame_bytes}), or no frame of the largest size could be sent")
        self.app = app
        self.max_bytes_per_s, self.bytes_burst, self.max_frame_bytes = max_bytes_per_s, bytes_burst, max_frame_bytes

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        guard = _SocketGuard(self, receive, send, scope.get("client"))
        await self.app(scope, guard.receive, guard.send)


class _SocketGuard:
    """One WebSocket: counts its frames' bytes; once over budget, closes it and stands in for it."""

    def __init__(self, limits: ProxyGuard, receive: Receive, send: Send, client: Any) -> None:
        self._limits = limits
        self._receive, self._send = receive, send
        self._client = client
        self._bytes = TokenBucket(limits.max_bytes_per_s, limits.bytes_burst)
        self._closed = False  # by this guard: the app's later sends go nowhere

    async def receive(self) -> Message:
        if self._closed:
            return {"type": "websocket.disconnect", "code": POLICY_VIOLATION}
        msg = await self._receive()
        if msg["type"] != "websocket.receive":
            return msg
        data = msg.get("bytes")
        nbytes = data.size if isinstance(data, SkippedPayload) else len(data or b"") or len(msg.get("text") or "")
        if self._bytes.take(nbytes):
            reason = (f"more than {self._limits.max_bytes_per_s / 2**20:g} MiB per second sent (bursts up to "
                      f"{self._limits.bytes_burst / 2**20:g} MiB); slow down")
            del msg
            await self._close(reason)
            return {"type": "websocket.disconnect", "code": POLICY_VIOLATION}
        if nbytes > self._limits.max_frame_bytes:
            return {"type": "websocket.receive", "bytes": None, "text": None, DROPPED_FRAME_BYTES: nbytes}
        return msg

    async def send(self, msg: Message) -> None:
        if not self._closed:
            await self._send(msg)

    async def _close(self, reason: str) -> None:
        self._closed = True
        log.warning("proxy guard closed a WebSocket: %s (client=%s)", reason, self._client)
        try:
            await self._send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": reason})
        except Exception:  # noqa: BLE001 - the client is already gone: nothing to close
            pass


def no_deflate() -> None:
    """Make uvicorn's default `ws_per_message_deflate` False in this process (Serve builds its
    `uvicorn.Config` after the callback ran, without that argument). Idempotent."""
    import uvicorn

    init = uvicorn.Config.__init__
    if getattr(init, "_lwf_no_deflate", False):
        return

    @functools.wraps(init)
    def without_deflate(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("ws_per_message_deflate", False)
        init(self, *args, **kwargs)

    without_deflate._lwf_no_deflate = True  # type: ignore[attr-defined]
    uvicorn.Config.__init__ = without_deflate  # type: ignore[method-assign]


class SkippedPayload(bytes):
    """The payload of a frame over the cap, never read into memory: empty, with its `size`."""

    size: int

    def __new__(cls, size: int) -> "SkippedPayload":
        self = super().__new__(cls)
        self.size = size
        return self


def _discard(reader: Any, n: int) -> Generator[None, None, None]:
    """Drop the next `n` bytes of a websockets `StreamReader` as they arrive (never more than
    one network read is held)."""
    while n:
        if not reader.buffer:
            if reader.eof:
                raise EOFError(f"stream ends {n} bytes before the end of a frame")
            yield
            continue
        take = min(n, len(reader.buffer))
        del reader.buffer[:take]
        n -= take


def skip_large_frames(max_frame_bytes: int) -> None:
    """Make the websockets parser in this process (uvicorn's sans-I/O protocol) skip the payload
    of a frame over `max_frame_bytes` instead of buffering it: the frame arrives as an empty
    binary frame whose data is a `SkippedPayload` naming its size, which the guard counts and
    turns into the too_large stub as before. Without it uvicorn holds each frame up to its 16 MiB
    `ws_max_size` two to three times over (the read buffer, the slice, the unmasked copy) before
    the guard can look at it. A fragmented message whose fragment passes the cap fails the
    connection (1009, message too big): its other fragments would be joined without the marker.
    Frames over `ws_max_size` still close 1009 at their header. Idempotent (the last cap wins)."""
    from websockets import protocol
    from websockets.exceptions import PayloadTooBig
    from websockets.frames import Frame, Opcode

    if getattr(protocol.Frame, "lwf_cap", None):
        protocol.Frame.lwf_cap = max_frame_bytes
        return

    class CappedFrame(Frame):
        lwf_cap = max_frame_bytes

        @classmethod
        def parse(cls, read_exact: Any, *, mask: bool, max_size: int | None = None,
                  extensions: Any = None) -> Generator[None, None, Frame]:
            skipped = 0

            def capped_read(n: int) -> Generator[None, None, bytes | bytearray]:
                nonlocal skipped
                if n <= max(cls.lwf_cap, 8):  # a header is read at most 8 bytes at a time
                    return (yield from read_exact(n))
                skipped = n  # the payload
                yield from _discard(read_exact.__self__, n)
                return b""

            frame = yield from super().parse(capped_read, mask=mask, max_size=max_size, extensions=extensions)
            if not skipped:
                return frame
            if frame.opcode not in (Opcode.TEXT, Opcode.BINARY) or not frame.fin or frame.rsv1:
                raise PayloadTooBig(skipped, cls.lwf_cap)
            return Frame(Opcode.BINARY, SkippedPayload(skipped))

    protocol.Frame = CappedFrame  # type: ignore[misc]  # the name protocol.py parses and builds frames with


def middlewares() -> list[Middleware]:
    """The proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`): the guard with the
    limits from the environment (defaults: AppArgs.connection's and the default max_message_bytes);
    permessage-deflate off (`no_deflate`)."""
    no_deflate()
    defaults = ConnectionArgs()
    max_frame = int(os.environ.get(MAX_FRAME_BYTES_ENV, DEFAULT_MAX_MESSAGE_BYTES))
    skip_large_frames(max_frame)
    rate = float(os.environ.get(MAX_BYTES_PER_S_ENV, defaults.max_bytes_per_s))
    burst = int(os.environ.get(BYTES_BURST_ENV, defaults.bytes_burst or 2 * max_frame))
    return [Middleware(ProxyGuard, max_bytes_per_s=rate, bytes_burst=burst, max_frame_bytes=max_frame)]
