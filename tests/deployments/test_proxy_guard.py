"""ProxyGuard (the byte budget inside Serve's proxy) driven as plain ASGI, and the ingress's
answer to a frame it kept back."""
from __future__ import annotations

import asyncio

import pytest

from deployments.proxy_guard import DROPPED_FRAME_BYTES, ProxyGuard, middlewares
from deployments.ingress.transport import frame_size, oversize
from protocol.errors import ErrorCode
from protocol.limits import Limits

KIB = 1024


def _run(frames: list[bytes], *, rate: float = 1.0, burst: int = 100 * KIB, max_frame: int = 40 * KIB):
    """Frames from a client through the guard to an app that reads until a disconnect: what the
    app received, and what reached the client (the app's sends and the guard's close)."""
    inbox = [{"type": "websocket.receive", "bytes": f} for f in frames] + [{"type": "websocket.disconnect",
                                                                             "code": 1000}]
    received, sent = [], []

    async def receive():
        return inbox.pop(0)

    async def send(msg):
        sent.append(msg)

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            received.append(msg)
            await send({"type": "websocket.send", "bytes": b"reply"})
            if msg["type"] == "websocket.disconnect":
                return

    guard = ProxyGuard(app, max_bytes_per_s=rate, bytes_burst=burst, max_frame_bytes=max_frame)
    asyncio.run(guard({"type": "websocket", "client": ("1.2.3.4", 5)}, receive, send))
    return received, sent


def test_a_socket_over_its_byte_budget_is_closed_and_its_frame_goes_nowhere():
    received, sent = _run([b"a" * 30 * KIB, b"b" * 30 * KIB, b"c" * 30 * KIB, b"d" * 30 * KIB])
    assert [len(m.get("bytes") or b"") for m in received] == [30 * KIB] * 3 + [0]
    assert received[-1] == {"type": "websocket.disconnect", "code": 1008}
    close = [m for m in sent if m["type"] == "websocket.close"]
    assert len(close) == 1 and close[0]["code"] == 1008 and "MiB per second" in close[0]["reason"]
    assert sent[-1] is close[0]  # the app's sends after the close go nowhere


def test_a_frame_over_the_size_cap_is_kept_back_and_the_ingress_answers_too_large():
    received, sent = _run([b"x" * 50 * KIB, b"y" * 10 * KIB])
    stub, small = received[0], received[1]
    assert stub["bytes"] is None and stub[DROPPED_FRAME_BYTES] == 50 * KIB
    assert small["bytes"] == b"y" * 10 * KIB  # the socket stays usable
    assert not [m for m in sent if m["type"] == "websocket.close"]
    assert frame_size(stub) == 50 * KIB and frame_size(small) == 10 * KIB  # the ingress's budget counts it
    error = oversize(stub, Limits(max_message_bytes=40 * KIB))
    assert error.code is ErrorCode.TOO_LARGE and f"{50 * KIB} bytes; at most {40 * KIB}" in error.message
    assert oversize(small, Limits(max_message_bytes=40 * KIB)) is None


def test_http_passes_untouched_and_the_callback_reads_the_environment(monkeypatch):
    seen = []

    async def app(scope, receive, send):
        seen.append((await receive())["body"])

    async def receive():
        return {"type": "http.request", "body": b"z" * 500 * KIB}

    asyncio.run(ProxyGuard(app, 1.0, 100 * KIB, 40 * KIB)({"type": "http"}, receive, None))
    assert seen == [b"z" * 500 * KIB]
    monkeypatch.setenv("LWF_PROXY_MAX_FRAME_BYTES", str(64 * KIB))
    monkeypatch.setenv("LWF_PROXY_MAX_BYTES_PER_S", "1000")
    (mw,) = middlewares()
    assert mw.kwargs == {"max_bytes_per_s": 1000.0, "bytes_burst": 128 * KIB, "max_frame_bytes": 64 * KIB}
    with pytest.raises(ValueError, match="at least"):
        ProxyGuard(app, 1.0, 10 * KIB, 40 * KIB)


def test_the_callback_turns_permessage_deflate_off_in_uvicorn():
    import uvicorn

    init = uvicorn.Config.__init__
    try:
        middlewares()
        middlewares()  # idempotent
        assert uvicorn.Config(lambda: None).ws_per_message_deflate is False
        assert uvicorn.Config(lambda: None, ws_per_message_deflate=True).ws_per_message_deflate is True
    finally:
        uvicorn.Config.__init__ = init
