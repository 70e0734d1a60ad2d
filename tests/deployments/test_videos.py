"""`POST /v1/videos` pieces without Ray: the body cap, the bounded JSON parse, the frame cap,
the bounded job store (owners, cancel), and the session runner driving a Connection-like
handler over a `LocalTransport`."""
from __future__ import annotations

import asyncio
import json

import msgpack
import pytest

from deployments.ingress.transport import LocalTransport
from deployments.ingress.videos.errors import HttpError
from deployments.ingress.videos.jobs import JobStatus, JobStore, VideoJob
from deployments.ingress.videos.json_guard import TOKEN, load_bounded
from deployments.ingress.videos.request import MAX_DEPTH, BodyBudget, max_tokens, parse_request, read_body
from protocol.errors import ProtocolError
from protocol.limits import DEFAULT_LIMITS
from deployments.ingress.videos.runner import SessionRunner
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
    budget = BodyBudget(128 * MIB)
    with pytest.raises(HttpError) as e:
        asyncio.run(read_body(body, 64 * MIB, budget))
    assert e.value.status == 413 and e.value.body["code"] == "too_large"
    assert body.read == 65  # the chunk that passed the cap, and nothing after it
    assert budget.held == 0  # given back
    assert asyncio.run(read_body(Chunks(n=4, size=MIB), 4 * MIB, budget)) == b"x" * (4 * MIB)
    assert budget.held == 4 * MIB  # until the caller is done with the body


def test_bodies_held_at_once_are_bounded_across_requests():
    """Two bodies of the cap's size fit the budget; a third, declared or chunked, gets busy at
    once (a declared one before any byte is read) and the budget is whole again after."""
    async def go():
        budget = BodyBudget(2 * 4 * MIB)
        held = [await read_body(Chunks(4, MIB), 4 * MIB, budget, declared=4 * MIB) for _ in range(2)]
        refused = []
        for declared in (4 * MIB, None):
            chunks = Chunks(4, MIB)
            with pytest.raises(HttpError) as e:
                await read_body(chunks, 4 * MIB, budget, declared)
            refused.append((e.value.status, e.value.body["code"], chunks.read))
        full = budget.held
        for b in held:
            budget.give(len(b))
        return refused, full, budget.held

    refused, full, after = asyncio.run(go())
    assert refused == [(503, "busy", 0), (503, "busy", 1)] and full == 8 * MIB and after == 0


class CountingTokens:
    """Wraps the guard's token regex and counts the tokens it hands out (the work done)."""

    def __init__(self) -> None:
        self.n = 0

    def finditer(self, body):
        for m in TOKEN.finditer(body):
            self.n += 1
            yield m


def test_a_body_of_millions_of_values_is_refused_after_the_token_budget(monkeypatch):
    """60 MiB of floats (15 M values, ~1 GB as Python objects) or of empty lists: `too_large`
    after the budget's tokens, before json.loads builds anything (it is never called)."""
    import deployments.ingress.videos.json_guard as guard

    def no_loads(_):
        raise AssertionError("json.loads ran on a body past the token budget")

    monkeypatch.setattr(guard.json, "loads", no_loads)
    budget = max_tokens(481)
    for body in (b"[" + b"0.1," * (15 * MIB) + b"0.1]", b'{"poses": [' + b"[]," * (20 * MIB) + b"[]]}"):
        counter = CountingTokens()
        monkeypatch.setattr(guard, "TOKEN", counter)
        with pytest.raises(ProtocolError) as e:
            load_bounded(body, budget, MAX_DEPTH)
        assert e.value.code is ErrorCode.TOO_LARGE and f"more than {budget} JSON tokens" in e.value.message
        assert counter.n == budget + 1  # it stopped at the first token past the budget


def test_a_deeply_nested_body_is_a_bad_message_not_a_crash():
    for body in (b'{"poses": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
                 b'{"poses": ' + b'{"a": ' * 200_000 + b"1" + b"}" * 200_001, b'{"poses": ' + b"[" * 200_000):
        with pytest.raises(HttpError) as e:
            parse_request(body, DEFAULT_LIMITS, 481)
        assert (e.value.status, e.value.body["code"]) == (400, "bad_message"), e.value.body
        assert "nested deeper than 8" in e.value.body["message"]


def test_a_form_upload_or_a_bare_file_is_told_to_send_json():
    """A multipart upload (curl -F) was answered "nested deeper than 8 levels" (its PNG bytes hold
    brackets), a bare array or file in tech words: each is told what to send (issue 48)."""
    multipart = (b'--XyZ\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
                 b"Content-Type: image/png\r\n\r\n\x89PNG" + b"[" * 50 + b"\r\n--XyZ--\r\n")
    for body in (multipart, b"\x89PNG\r\n\x1a\n" + b"[" * 20, b"[1, 2]", b"  prompt=a+walk"):
        with pytest.raises(HttpError) as e:
            parse_request(body, DEFAULT_LIMITS, 481)
        assert (e.value.status, e.value.body["code"]) == (400, "bad_message")
        assert e.value.body["message"].startswith("send JSON (docs/VIDEOS.md): the body is one JSON object")


def test_brackets_and_quotes_inside_strings_are_not_structure():
    prompt = 'a "quoted" [[[[[[[[[ scene {{{{{{{{, with: colons' * 10
    body = json.dumps({"prompt": prompt, "poses": [[[1.0] * 4] * 4], "k": "\\\"["}).encode()
    assert load_bounded(body, 64, MAX_DEPTH)["prompt"] == prompt


def test_num_frames_over_the_videos_cap_is_refused_naming_it():
    body = json.dumps({"image": "aGk=", "prompt": "p", "poses": [[[1.0] * 4] * 4], "intrinsics": [[1.0] * 4],
                       "num_frames": 4089}).encode()
    with pytest.raises(HttpError) as e:
        parse_request(body, DEFAULT_LIMITS, 481)
    assert (e.value.status, e.value.body["code"]) == (413, "too_large")
    assert "at most 481 frames (videos.max_frames)" in e.value.body["message"]


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

        a, b = VideoJob(9, 1, "o"), VideoJob(9, 1, "o")
        store.start(a, work)
        store.start(b, work)
        with pytest.raises(HttpError) as refused:
            store.start(VideoJob(9, 1, "o"), work)  # two jobs running: no place
        gate.set()
        await asyncio.gather(a.task, b.task)
        assert (a.status, a.video, a.chunks_done) == (JobStatus.SUCCEEDED, b"mp4", 1)
        c = VideoJob(9, 1, "o")
        store.start(c, work)  # the oldest finished job makes room
        kept = (store.get(a.id, "o"), store.get(b.id, "o"), store.get(c.id, "o"))
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

        job = VideoJob(9, 1, "o")
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


def test_a_job_is_found_and_removed_only_by_its_owner_and_removing_cancels_it():
    async def go():
        store = JobStore(max_jobs=4, ttl_s=60.0, retry_after_s=1.0)
        started, released = asyncio.Event(), asyncio.Event()

        async def work(on_chunk) -> bytes:
            try:
                started.set()
                await asyncio.Event().wait()  # a long session
                return b"mp4"
            finally:
                released.set()  # the runner's `finally`: hang up, the Connection releases the session

        job = VideoJob(9, 1, "key key0")
        store.start(job, work)
        await started.wait()
        seen = (store.get(job.id, "key key1"), store.get(job.id, "address 10.0.0.1"), store.get(job.id, "key key0"))
        active = (store.active("key key0"), store.active("key key1"))
        not_theirs = await store.remove(job.id, "key key1")
        still_running = job.status
        removed = await store.remove(job.id, "key key0")
        return seen, active, not_theirs, still_running, removed, released.is_set(), store.get(job.id, "key key0")

    seen, active, not_theirs, still_running, removed, released, after = asyncio.run(go())
    assert seen[0] is None and seen[1] is None and seen[2] is not None
    assert active == (1, 0)
    assert not_theirs is None and still_running is JobStatus.RUNNING
    assert removed.status is JobStatus.CANCELLED and removed.task.done() and released
    assert removed.view("/v1/videos")["status"] == "cancelled" and after is None
