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


def _frames_through_the_parser(payloads: list[tuple[int, bytes, bool]], *, max_size: int, chunk: int = 4096):
    """Client frames (opcode, payload, fin) fed in `chunk`-byte reads to the websockets server
    parser uvicorn uses: the frames it produced, what it sends back, and the largest read buffer."""
    from websockets.frames import Frame, Opcode
    from websockets.protocol import OPEN
    from websockets.server import ServerProtocol

    conn = ServerProtocol(max_size=max_size)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    (request,) = conn.events_received()
    conn.send_response(conn.accept(request))
    assert conn.state is OPEN
    conn.data_to_send()
    wire = b"".join(Frame(Opcode(op), data, fin).serialize(mask=True) for op, data, fin in payloads)
    frames, peak = [], 0
    for i in range(0, len(wire), chunk):
        conn.receive_data(wire[i:i + chunk])
        peak = max(peak, len(conn.reader.buffer))
        frames += conn.events_received()
    return frames, b"".join(conn.data_to_send()), peak


def test_the_parser_skips_a_frame_over_the_cap_without_buffering_it(monkeypatch):
    from websockets import protocol
    from websockets.frames import Opcode

    from deployments.proxy_guard import SkippedPayload, skip_large_frames

    monkeypatch.setattr(protocol, "Frame", protocol.Frame)  # restored after the test
    skip_large_frames(40 * KIB)
    skip_large_frames(40 * KIB)  # idempotent
    frames, out, peak = _frames_through_the_parser(
        [(2, b"x" * 300 * KIB, True), (1, b"t" * 50 * KIB, True), (2, b"y" * 10 * KIB, True)], max_size=16 * 2**20)
    assert [(f.opcode, len(f.data)) for f in frames] == [(Opcode.BINARY, 0), (Opcode.BINARY, 0),
                                                         (Opcode.BINARY, 10 * KIB)]
    assert [f.data.size for f in frames[:2]] == [300 * KIB, 50 * KIB]
    assert isinstance(frames[0].data, SkippedPayload) and frames[2].data == b"y" * 10 * KIB
    assert out == b"" and peak < 16 * KIB  # nothing sent back; at most the 10 KiB frame held, never 300

    # the guard counts a skipped frame at its size and hands the ingress the too_large stub
    received, _ = _run([frames[0].data, frames[2].data], burst=400 * KIB)
    assert received[0][DROPPED_FRAME_BYTES] == 300 * KIB and received[1]["bytes"] == b"y" * 10 * KIB
    received, sent = _run([frames[0].data], burst=100 * KIB)
    assert received[0] == {"type": "websocket.disconnect", "code": 1008}


def test_the_parser_still_closes_1009_over_its_max_size_and_for_a_fragment_over_the_cap(monkeypatch):
    from websockets import protocol

    from deployments.proxy_guard import skip_large_frames

    monkeypatch.setattr(protocol, "Frame", protocol.Frame)
    skip_large_frames(40 * KIB)
    for frames in ([(2, b"z" * 200 * KIB, True)], [(2, b"a" * 50 * KIB, False), (0, b"b", True)]):
        _, out, peak = _frames_through_the_parser(frames, max_size=100 * KIB)
        assert out[0] == 0x88 and int.from_bytes(out[2:4], "big") == 1009, out  # close, message too big
        assert peak <= 8 * KIB
