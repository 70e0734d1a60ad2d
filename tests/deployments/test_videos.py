"""`POST /v1/videos` pieces without Ray: the body cap, the bounded job store, and the session
runner driving a Connection-like handler over a `LocalTransport`."""
from __future__ import annotations

import asyncio

import msgpack
import pytest

from deployments.transport import LocalTransport
from deployments.videos.errors import HttpError
from deployments.videos.jobs import JobStatus, JobStore, VideoJob
from deployments.videos.request import read_body
from deployments.videos.runner import SessionRunner
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply

MIB = 1024 * 1024


class Chunks:
    """An async body of `n` chunks of `size` bytes that counts what was read."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size, self.read = n, size, 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        if self.read == self.n:
            raise StopAsyncIteration
        self.read += 1
        return b"x" * self.size


def test_the_body_is_refused_as_soon_as_it_passes_the_cap():
    body = Chunks(n=256, size=MIB)  # 256 MiB, no Content-Length
    with pytest.raises(HttpError) as e:
        asyncio.run(read_body(body, 64 * MIB))
    assert e.value.status == 413 and e.value.body["code"] == "too_large"
    assert body.read == 65  # the chunk that passed the cap, and nothing after it
    assert asyncio.run(read_body(Chunks(n=4, size=MIB), 4 * MIB)) == b"x" * (4 * MIB)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_jobs_beyond_the_bound_are_refused_and_finished_ones_expire():
    async def go():
        clock = Clock()
        store = JobStore(max_jobs=2, ttl_s=60.0, retry_after_s=3.0, clock=clock)
        gate = asyncio.Event()

        async def work(on_chunk) -> bytes:
            await gate.wait()
            on_chunk(0)
            return b"mp4"

        a, b = VideoJob(9, 1), VideoJob(9, 1)
        store.start(a, work)
        store.start(b, work)
        with pytest.raises(HttpError) as refused:
            store.start(VideoJob(9, 1), work)  # two jobs running: no place
        gate.set()
        await asyncio.gather(a.task, b.task)
        assert (a.status, a.video, a.chunks_done) == (JobStatus.SUCCEEDED, b"mp4", 1)
        c = VideoJob(9, 1)
        store.start(c, work)  # the oldest finished job makes room
        kept = (store.get(a.id), store.get(b.id), store.get(c.id))
        await c.task
        clock.t = 61.0  # results expire
        return refused.value, kept, len(store)

    refused, kept, held = asyncio.run(go())
    assert refused.status == 503 and refused.body["code"] == "busy" and refused.retry_after_s == 3.0
    assert kept[0] is None and kept[1] is not None and kept[2] is not None
    assert held == 0


def test_a_failed_job_keeps_its_error():
    async def go():
        store = JobStore(max_jobs=1, ttl_s=60.0, retry_after_s=1.0)

        async def work(on_chunk) -> bytes:
            raise HttpError.of(ErrorCode.SESSION_LOST, "gone")

        job = VideoJob(9, 1)
        store.start(job, work)
        await job.task
        return job

    job = asyncio.run(go())
    assert job.status is JobStatus.FAILED and job.error.status == 503 and job.view("/v1/videos")["error"]["code"] == \
        "session_lost"


class FakeServer:
    """A Connection stand-in: handshake, then one reply per request in order; the first
    `busy_first` requests of chunk 0 are refused as busy (with every request after them)."""

    def __init__(self, busy_first: int = 0, retry_after_s: float = 0.01) -> None:
        self.busy_first, self.retry_after_s = busy_first, retry_after_s
        self.received: list[int] = []
        self.left = False
        self.clock = Clock()  # advanced by retry_after_s per refusal of chunk 0

    async def __call__(self, transport: LocalTransport, key_id) -> None:
        await transport.send_bytes(encode(CameraServerConfig(model="fake")))
        refusing = False
        while True:
            msg = await transport.receive()
            if msg["type"] == "websocket.disconnect":
                self.left = True
                return
            k = msgpack.unpackb(msg["bytes"])["k"]
            self.received.append(k)
            if k == 0:
                refusing = self.busy_first > 0
                self.busy_first -= 1
                self.clock.t += self.retry_after_s if refusing else 0.0
            if refusing:
                reply = ErrorReply(code=ErrorCode.BUSY, message="full", retry_after_s=self.retry_after_s)
            else:
                reply = FrameReply(session_id="s", chunk_id=k, video=bytes([k]), num_frames=9 if k == 0 else 12,
                                   resolution=(32, 48), client_chunk_id=k)
            await transport.send_bytes(encode(reply))


def requests(n: int) -> list[bytes]:
    return [msgpack.packb({"k": k}) for k in range(n)]


def test_the_runner_waits_out_busy_and_joins_the_chunks_in_order():
    server = FakeServer(busy_first=2)
    done: list[int] = []
    video = asyncio.run(SessionRunner(server, pipeline=2, busy_timeout_s=5.0).run(requests(4), None, done.append))
    assert video == bytes([0, 1, 2, 3]) and done == [0, 1, 2, 3]
    assert server.received == [0, 1, 0, 1, 0, 1, 2, 3]  # chunk 1 went out with chunk 0 each time
    assert server.left  # the connection was closed after the session


def test_the_runner_gives_up_on_busy_after_its_timeout():
    server = FakeServer(busy_first=100, retry_after_s=0.05)
    with pytest.raises(HttpError) as e:  # refused at 0.05, 0.10, 0.15: the third retry would end past 0.05 + 0.12
        asyncio.run(SessionRunner(server, pipeline=2, busy_timeout_s=0.12, clock=server.clock).run(requests(3)))
    assert e.value.status == 503 and e.value.body["code"] == "busy" and e.value.retry_after_s == 0.05
    assert server.received.count(0) == 3 and server.left
