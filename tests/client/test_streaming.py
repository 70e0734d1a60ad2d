"""The pipelined streamer against a scripted in-memory server: window, order, busy retries, errors."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional

import numpy as np
import pytest

from client.errors import ServerError
from client.stats import ChunkStat, StreamSummary
from client.streaming import stream_session
from protocol.codec import decode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Reply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

INIT = b"\x00\x00\x00\x08ftyp"


class ScriptedServer:
    """Answers requests in order like the ingress: `busy` while `max_pending` are in flight or
    while the first chunk's open is refused `open_refusals` times; otherwise a frame."""

    def __init__(self, max_pending: int = 8, open_refusals: int = 0, fail_chunk: Optional[int] = None,
                 cached_below: int = 0) -> None:
        self.max_pending = max_pending
        self.cached_below = cached_below  # chunks below it come from the prefix store (`cached`)
        self.open_refusals = open_refusals
        self.fail_chunk = fail_chunk
        self.received: list[int] = []  # client_chunk_id of every request, in arrival order
        self.pending: deque[Reply] = deque()
        self.max_seen_pending = 0
        self.next_chunk = 0
        self.opened = False

    async def send(self, data: bytes) -> None:
        req = decode(data)
        self.received.append(req.client_chunk_id)
        self.max_seen_pending = max(self.max_seen_pending, len(self.pending) + 1)
        if len(self.pending) >= self.max_pending:
            self.pending.append(ErrorReply(code=ErrorCode.BUSY, message="pipeline full", retry_after_s=0.0))
        elif req.image is not None and self.open_refusals:
            self.open_refusals -= 1
            self.pending.append(ErrorReply(code=ErrorCode.BUSY, message="no slot", retry_after_s=0.01))
        elif req.image is None and not self.opened:
            self.pending.append(ErrorReply(code=ErrorCode.SESSION_LOST, message="lost"))
        elif req.client_chunk_id == self.fail_chunk:
            self.pending.append(ErrorReply(code=ErrorCode.BAD_CAMERAS, message="nope"))
        else:
            self.opened = True
            video = (INIT if self.next_chunk == 0 else b"") + bytes([self.next_chunk])
            self.pending.append(FrameReply(session_id=req.session_id, chunk_id=self.next_chunk, video=video,
                                           num_frames=9 if self.next_chunk == 0 else 12, resolution=(32, 48),
                                           stage_durations={"dit": 0.1}, client_chunk_id=req.client_chunk_id,
                                           cached=True if self.next_chunk < self.cached_below else None))
            self.next_chunk += 1

    async def receive(self, timeout_s: Optional[float] = None) -> Reply:
        await asyncio.sleep(0)
        return self.pending.popleft()


def messages(n: int) -> list[bytes]:
    eye = np.eye(4, dtype=np.float32)[None]
    k = np.array([[500, 500, 416, 240]], dtype=np.float32)
    png = _png()
    start = SessionStart(png, "p")
    return [encode(infer_request("s", eye, k, start=None if i else start, client_chunk_id=i)) for i in range(n)]


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, format="PNG")
    return buf.getvalue()


def run(server: ScriptedServer, n: int, **kw):
    return asyncio.run(stream_session(server, messages(n), **kw))


def test_window_and_order():
    server = ScriptedServer()
    seen = []
    result = run(server, 5, pipeline=3, on_chunk=lambda stat, reply: seen.append((stat.index, reply.chunk_id)))
    assert server.received == [0, 1, 2, 3, 4]
    assert server.max_seen_pending == 3
    assert seen == [(k, k) for k in range(5)]
    assert result.video.data == INIT + bytes(range(5))
    assert [s.num_frames for s in result.stats] == [9, 12, 12, 12, 12]


def test_busy_open_is_retried_with_later_chunks_resent():
    server = ScriptedServer(open_refusals=2)
    busy = []
    result = run(server, 3, pipeline=2, on_busy=busy.append)
    # each refused open also fails the chunk sent after it (session_lost); both are sent again
    assert server.received == [0, 1, 0, 1, 0, 1, 2]
    assert [e.code for e in busy] == [ErrorCode.BUSY, ErrorCode.BUSY]
    assert [s.index for s in result.stats] == [0, 1, 2]


def test_pipeline_overflow_is_resent_in_order():
    server = ScriptedServer(max_pending=1)
    result = run(server, 3, pipeline=2)
    assert [s.index for s in result.stats] == [0, 1, 2]
    assert result.video.data == INIT + bytes([0, 1, 2])


def test_busy_gives_up_after_the_timeout():
    server = ScriptedServer(open_refusals=100)
    with pytest.raises(ServerError) as e:
        run(server, 2, pipeline=1, busy_timeout_s=0.05)
    assert e.value.code is ErrorCode.BUSY


def test_error_reply_is_raised_with_its_code():
    with pytest.raises(ServerError, match=r"\[bad_cameras\] nope"):
        run(ScriptedServer(fail_chunk=1), 3, pipeline=1)


def test_summary_numbers():
    stats = [ChunkStat(0, 9, 0.0, 2.0, {"dit": 1.0, "text_encode": 0.2}),
             ChunkStat(1, 12, 1.5, 2.5, {"dit": 0.5, "mux": 0.1, "text_encode": 0.0}),
             ChunkStat(2, 12, 2.0, 3.5, {"dit": 0.6}), ChunkStat(3, 12, 3.0, 4.0, {"dit": 0.7})]
    s = StreamSummary.of(stats, started_at=0.5)
    assert (s.chunks, s.frames) == (4, 45)
    assert s.time_to_first_chunk_s == pytest.approx(1.5)
    # intervals 0.5, 1.0, 0.5 -> sorted 0.5, 0.5, 1.0; p95 sits at 1.9 of 2: 0.5 + 0.9 * 0.5
    assert s.interval_p50_s == pytest.approx(0.5)
    assert s.interval_p95_s == pytest.approx(0.95)
    assert s.fps == pytest.approx(36 / 2.0)
    assert s.stage_means_s == pytest.approx({"text_encode": 0.2, "dit": 0.7, "mux": 0.025})
    assert list(s.stage_means_s) == ["text_encode", "dit", "mux"]  # pipeline order
    text = s.format()
    assert "time to first chunk: 1500 ms" in text and "18.0 fps vs 16 fps" in text
    assert "p50 500 ms, p95 950 ms" in text and "text_encode 200 ms (first chunk)" in text
    assert s.cached == 0 and "prefix store" not in text


def test_chunks_from_the_prefix_store_are_counted_and_said():
    result = run(ScriptedServer(cached_below=2), 4, pipeline=2)
    assert [s.cached for s in result.stats] == [True, True, False, False]
    summary = result.summary()
    assert summary.cached == 2
    assert "from the server's prefix store: 2 of 4 chunks" in summary.format()
    assert not summary.replayed and "fps vs 16 fps" in summary.format()  # half computed: a speed to show


def test_a_session_replayed_from_the_prefix_store_shows_no_fps():
    """Most chunks from the store: the headline says replayed instead of an fps figure (issue 48:
    '401.3 fps' read as the model's speed)."""
    summary = run(ScriptedServer(cached_below=3), 4, pipeline=2).summary()
    assert summary.cached == 3 and summary.replayed
    text = summary.format()
    assert "achieved: replayed from the server's prefix store (3 of 4 chunks), not generated" in text
    assert " fps" not in text


def test_stage_means_leave_chunks_from_the_prefix_store_out():
    stats = [ChunkStat(0, 9, 0.0, 0.1, {"dit": 0.0, "text_encode": 0.0}, cached=True),
             ChunkStat(1, 12, 0.1, 1.0, {"dit": 0.8, "text_encode": 0.0}),
             ChunkStat(2, 12, 1.0, 2.0, {"dit": 0.6})]
    s = StreamSummary.of(stats, started_at=0.0)
    assert s.cached == 1 and s.stage_means_s == pytest.approx({"dit": 0.7})  # chunk 0 ran no stage: no text_encode
    assert "stages (mean per computed chunk): dit 700 ms" in s.format()
    only_stored = StreamSummary.of([ChunkStat(0, 9, 0.0, 0.1, {"dit": 0.0}, cached=True)], started_at=0.0)
    assert only_stored.stage_means_s == {} and "stages (mean per computed chunk): none computed" in only_stored.format()
