"""stream_session with a ResumePolicy against a scripted server that drops the socket: the
client reconnects, resumes with the token, takes the missed replies once and sends the rest."""
from __future__ import annotations

import asyncio
import io
from collections import deque
from typing import Optional

import numpy as np
import pytest
from PIL import Image
from websockets.exceptions import ConnectionClosedError

from client.errors import ServerError
from client.streaming import ResumePolicy, stream_session
from protocol.codec import decode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Reply, ResumeOk, ResumeRequest
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

TOKEN = "t" * 32
INIT = b"\x00\x00\x00\x08ftyp"


def messages(n: int) -> list[bytes]:
    """A session's n infers (chunk 0 with image and prompt)."""
    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, format="PNG")
    eye, k = np.eye(4, dtype=np.float32)[None], np.array([[500, 500, 416, 240]], dtype=np.float32)
    start = SessionStart(buf.getvalue(), "p")
    return [encode(infer_request("s", eye, k, start=None if i else start, client_chunk_id=i)) for i in range(n)]


class DroppingServer:
    """Accepts infers in order; the socket drops once `drop_after_accepted` infers were
    accepted: replies not yet read are kept for a resume, frames sent after the drop are lost.
    A `resume` with the right token sends the kept replies from `resume_from`, then `resumed`."""

    def __init__(self, drop_after_accepted: int, unauthorized_first: int = 0) -> None:
        self.drop_after = drop_after_accepted
        self.unauthorized_first = unauthorized_first
        self.accepted: list[FrameReply] = []
        self.pending: deque[Reply] = deque()
        self.received: list[object] = []  # client_chunk_id of infers, "resume" for resumes, "lost" after a drop
        self.dropped = False
        self.connections = 1

    async def reconnect(self) -> None:
        self.connections += 1
        self.dropped = False
        self.pending.clear()

    def _frame(self, k: int, client_chunk_id: Optional[int]) -> FrameReply:
        return FrameReply(session_id="s", chunk_id=k, video=(INIT if k == 0 else b"") + bytes([k]),
                          num_frames=9 if k == 0 else 12, resolution=(32, 48), stage_durations={"dit": 0.1},
                          client_chunk_id=client_chunk_id, resume_token=TOKEN if k == 0 else None)

    async def send(self, data: bytes) -> None:
        if self.dropped:
            self.received.append("lost")
            raise ConnectionClosedError(None, None)
        req = decode(data)
        if isinstance(req, ResumeRequest):
            self.received.append("resume")
            if self.unauthorized_first:
                self.unauthorized_first -= 1
                self.pending.append(ErrorReply(code=ErrorCode.UNAUTHORIZED, message="not parked yet"))
                return
            assert req.resume_token == TOKEN
            again = [r for r in self.accepted if r.chunk_id >= (req.resume_from or 0)]
            self.pending.extend(again)
            self.pending.append(ResumeOk(session_id="s", next_chunk_id=len(self.accepted), replayed=len(again)))
            return
        self.received.append(req.client_chunk_id)
        assert req.client_chunk_id == len(self.accepted), "a chunk out of order"
        reply = self._frame(len(self.accepted), req.client_chunk_id)
        self.accepted.append(reply)
        self.pending.append(reply)
        if len(self.accepted) == self.drop_after and self.connections == 1:
            self.dropped = True

    async def receive(self, timeout_s: Optional[float] = None) -> Reply:
        await asyncio.sleep(0)
        if self.dropped:
            raise ConnectionClosedError(None, None)
        return self.pending.popleft()


def _video(n: int) -> bytes:
    return INIT + bytes(range(n))


@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_a_dropped_socket_is_resumed_and_the_video_is_whole(pipeline):
    """The drop comes as the 4th chunk is accepted: the `pipeline` replies not yet read (the
    chunks in flight) come again once, then the client sends chunks 4 and 5; none twice."""
    server = DroppingServer(drop_after_accepted=4)
    result = asyncio.run(stream_session(server, messages(6), pipeline=pipeline,
                                        resume=ResumePolicy("s", backoff_s=0.0)))
    assert result.video.data == _video(6)
    assert [s.index for s in result.stats] == list(range(6))
    assert result.resumes == 1 and server.connections == 2 and result.replayed == pipeline
    assert [r for r in server.received if isinstance(r, int)] == list(range(6))


def test_unauthorized_while_the_server_parks_is_retried():
    server = DroppingServer(drop_after_accepted=2, unauthorized_first=2)
    result = asyncio.run(stream_session(server, messages(4), pipeline=1, resume=ResumePolicy("s", backoff_s=0.0)))
    assert [s.index for s in result.stats] == [0, 1, 2, 3] and result.resumes == 1
    assert server.connections == 4 and server.received.count("resume") == 3


def test_without_a_policy_or_before_the_first_reply_a_drop_ends_the_stream():
    with pytest.raises(ConnectionClosedError):
        asyncio.run(stream_session(DroppingServer(drop_after_accepted=2), messages(4), pipeline=1))
    with pytest.raises(ConnectionClosedError):  # no token yet: chunk 0's reply was never read
        asyncio.run(stream_session(DroppingServer(drop_after_accepted=1), messages(4), pipeline=1,
                                   resume=ResumePolicy("s", backoff_s=0.0)))


def test_a_refused_resume_is_the_servers_error():
    server = DroppingServer(drop_after_accepted=2, unauthorized_first=10)
    with pytest.raises(ServerError) as e:
        asyncio.run(stream_session(server, messages(4), pipeline=1, resume=ResumePolicy("s", attempts=3,
                                                                                         backoff_s=0.0)))
    assert e.value.code is ErrorCode.UNAUTHORIZED and server.connections == 4


class LineServer(DroppingServer):
    """A server whose line the session waits in: the first socket drops while it waits (the
    client saw a `queued` notice); on the next, a first infer with the notice's token starts it."""

    QUEUE_TOKEN = "q" * 24

    def __init__(self) -> None:
        super().__init__(drop_after_accepted=10**6)
        self.queued = None  # what WorldClient.receive keeps of the last `queued` notice
        self.first_infers: list[Optional[str]] = []  # the queue_token of each first infer

    async def send(self, data: bytes) -> None:
        from protocol.messages import Queued  # noqa: PLC0415
        if self.dropped:
            self.received.append("lost")
            raise ConnectionClosedError(None, None)
        req = decode(data)
        if req.image is not None:
            self.first_infers.append(req.queue_token)
        if self.connections == 1:  # in line, then gone
            self.queued = Queued(session_id="s", position=2, eta_s=30.0, queue_token=self.QUEUE_TOKEN)
            self.dropped = True
            return
        await super().send(data)


def test_a_socket_dropped_while_in_line_rejoins_with_the_queue_token():
    server = LineServer()
    result = asyncio.run(stream_session(server, messages(3), pipeline=2, resume=ResumePolicy("s", backoff_s=0.0)))
    assert result.video.data == _video(3) and result.resumes == 1
    assert server.first_infers == [None, LineServer.QUEUE_TOKEN]  # sent again, with its place's token
    assert [r for r in server.received if isinstance(r, int)] == [0, 1, 2]


def test_with_queue_token_sets_only_that_field():
    from client.streaming import with_queue_token  # noqa: PLC0415
    first = messages(1)[0]
    again = decode(with_queue_token(first, "q" * 24))
    assert again.queue_token == "q" * 24
    import msgpack  # noqa: PLC0415
    fields = msgpack.unpackb(with_queue_token(first, "q" * 24), raw=False)
    assert fields.pop("queue_token") == "q" * 24 and msgpack.packb(fields, use_bin_type=True) == first
