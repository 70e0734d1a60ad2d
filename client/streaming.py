"""Stream a session's chunk requests with up to N in flight; collect video and per-chunk stats.

Replies come in request order (PROTOCOL.md), so the i-th reply answers the i-th request.
`busy` (no session slot yet, or the connection's pipeline is full) rejects a request without
starting it: the request and every later one still in flight are sent again after
`retry_after_s`. Should a later request have been accepted meanwhile, the session would be
out of order; that is reported, never silently played.

With a `ResumePolicy` a dropped socket does not end the session: the channel reconnects, sends
`resume` with the session's token (its first frame reply's) and the count of replies it has,
takes the replies it missed, and sends again from the chunk the server's `resumed` names
(docs/SERVING.md, Resume). The video is the one an uninterrupted session would have given. A
socket that drops while the session waits in the server's line (`queued`, no chunk yet) is
reopened and the session sent again with the line's `queue_token`: it takes its old place.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

import msgpack

from client.errors import BadReply, ServerError
from client.stats import ChunkStat, StreamSummary
from media.reassembly import Fmp4Assembler
from websockets.exceptions import ConnectionClosed

from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Reply, ResumeOk, ResumeRequest

DEFAULT_BUSY_TIMEOUT_S = 300.0


class Channel(Protocol):
    """What the streamer needs of a connection (`WorldClient` is one)."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self, timeout_s: Optional[float] = None) -> Reply: ...


class Reconnectable(Channel, Protocol):
    """A channel that can open a new socket to the same server (`WorldClient` is one)."""

    async def reconnect(self) -> None: ...


@dataclass(frozen=True)
class ResumePolicy:
    """Resume the session `session_id` when its socket drops: up to `attempts` reconnects,
    `backoff_s` doubling between them (a server that has not yet seen the old socket end
    answers `unauthorized` for a moment: that is retried too)."""

    session_id: str
    attempts: int = 5
    backoff_s: float = 0.5


@dataclass
class StreamResult:
    """The reassembled MP4 and the timing of every chunk."""

    started_at: float
    video: Fmp4Assembler = field(default_factory=Fmp4Assembler)
    stats: list[ChunkStat] = field(default_factory=list)
    resumes: int = 0  # dropped sockets the session survived
    replayed: int = 0  # replies the server sent again on resuming
    resume_token: Optional[str] = None  # the session's (its first frame reply's), once received

    def summary(self) -> StreamSummary:
        return StreamSummary.of(self.stats, self.started_at)


async def stream_session(channel: Channel, messages: Sequence[bytes], *, pipeline: int = 1,
                         on_chunk: Optional[Callable[[ChunkStat, FrameReply], None]] = None,
                         on_busy: Optional[Callable[[ServerError], None]] = None,
                         busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                         reply_timeout_s: Optional[float] = None,
                         clock: Callable[[], float] = time.perf_counter,
                         resume: Optional[ResumePolicy] = None,
                         into: Optional[StreamResult] = None) -> StreamResult:
    """Send `messages` (packed infers of one session, in order), keeping up to `pipeline`
    in flight. Raises `ServerError` for an error reply (busy only after `busy_timeout_s`).
    `resume`: survive dropped sockets (the channel must be `Reconnectable`). `into`: the
    result to fill (what was received stays there when this raises), and its `token`."""
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    stream = _Stream(channel, messages, pipeline, on_chunk, on_busy, busy_timeout_s, reply_timeout_s, clock,
                     into if into is not None else StreamResult(started_at=clock()))
    while stream.next_k < len(messages) or stream.inflight:
        try:
            await stream.turn()
        except ConnectionClosed:
            queued = getattr(channel, "queued", None)  # the session waited in the server's line
            if resume is not None and stream.token is None and queued is not None and not stream.result.stats:
                await stream.rejoin(resume, queued.queue_token)  # its place back, with its token
                continue
            if resume is None or stream.token is None:  # not resumable (before chunk 0, or not asked)
                raise
            await stream.resume(resume)
    return stream.result


async def _attempts(policy: ResumePolicy) -> AsyncIterator[int]:
    """The policy's attempts, each after its backoff (doubling from `backoff_s`; none before the first)."""
    for attempt in range(policy.attempts):
        if attempt:
            await asyncio.sleep(policy.backoff_s * 2 ** (attempt - 1))
        yield attempt


def with_queue_token(frame: bytes, queue_token: str) -> bytes:
    """A packed first infer (or `drive`) with `queue_token` set: it takes that place in line."""
    fields = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    fields["queue_token"] = queue_token
    return msgpack.packb(fields, use_bin_type=True)


@dataclass
class _Stream:
    """One session's stream: what is sent, what is in flight, what came back."""

    channel: Channel
    messages: Sequence[bytes]
    pipeline: int
    on_chunk: Optional[Callable[[ChunkStat, FrameReply], None]]
    on_busy: Optional[Callable[[ServerError], None]]
    busy_timeout_s: float
    reply_timeout_s: Optional[float]
    clock: Callable[[], float]
    result: StreamResult
    inflight: deque[tuple[int, float]] = field(default_factory=deque)  # (request index, sent at)
    next_k: int = 0  # the next request to send
    busy_since: Optional[float] = None  # when the current run of `busy` replies began
    token: Optional[str] = None  # the session's resume token (its first frame reply's)

    def take(self, reply: FrameReply, k: int, sent_at: float) -> None:
        """Reply `k` (sent at `sent_at`) into the video and the stats."""
        if reply.client_chunk_id is not None and reply.client_chunk_id != k:
            raise BadReply(f"expected chunk {k}, got {reply.client_chunk_id}")
        try:
            self.result.video.append(reply.video)
        except ValueError as e:  # a session's first payload without its init segment
            raise BadReply(str(e)) from None
        self.token = reply.resume_token or self.token
        self.result.resume_token = self.token
        stat = ChunkStat(k, reply.num_frames, sent_at, self.clock(), dict(reply.stage_durations), bool(reply.cached))
        self.result.stats.append(stat)
        if self.on_chunk is not None:
            self.on_chunk(stat, reply)

    async def turn(self) -> None:
        """Fill the pipeline, then handle one reply."""
        while self.next_k < len(self.messages) and len(self.inflight) < self.pipeline:
            await self.channel.send(self.messages[self.next_k])
            self.inflight.append((self.next_k, self.clock()))
            self.next_k += 1
        reply = await self.channel.receive(self.reply_timeout_s)
        k, sent_at = self.inflight[0]
        if isinstance(reply, FrameReply):
            self.inflight.popleft()
            self.take(reply, k, sent_at)
            self.busy_since = None
        elif isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY:
            await self._retry_after_busy(ServerError.from_reply(reply), k)
        elif isinstance(reply, ErrorReply):
            raise ServerError.from_reply(reply)
        else:
            raise BadReply(f"expected a `frame` reply, got `{reply.type}`")

    async def _retry_after_busy(self, err: ServerError, k: int) -> None:
        """Request `k` was rejected: drop it and the later ones in flight, send again from `k`
        after the server's `retry_after_s` (or raise once busy outlasts `busy_timeout_s`)."""
        self.busy_since = self.clock() if self.busy_since is None else self.busy_since
        if self.clock() - self.busy_since + err.retry_after_s > self.busy_timeout_s:
            raise err
        await _drain_rejected(self.channel, len(self.inflight) - 1, self.reply_timeout_s)
        self.inflight.clear()
        if self.on_busy is not None:
            self.on_busy(err)
        await asyncio.sleep(err.retry_after_s)
        self.next_k = k

    def _reconnect(self) -> Callable[[], Awaitable[None]]:
        reconnect = getattr(self.channel, "reconnect", None)
        if reconnect is None:
            raise ServerError(ErrorCode.SESSION_LOST, "the socket dropped and this channel cannot reconnect")
        return reconnect

    async def rejoin(self, policy: ResumePolicy, queue_token: str) -> None:
        """The socket dropped while the session waited in the server's line (no chunk yet):
        reconnect and start it again with the line's token, which takes its old place (within
        the server's grace period)."""
        reconnect = self._reconnect()
        last: Exception | None = None
        async for _ in _attempts(policy):
            try:
                await reconnect()
            except (ConnectionClosed, OSError) as e:
                last = e
                continue
            self.messages = [with_queue_token(self.messages[0], queue_token), *self.messages[1:]]
            self.next_k = 0
            self.inflight.clear()
            self.result.resumes += 1
            return
        raise ServerError(ErrorCode.SESSION_LOST, f"the socket dropped while in line and {policy.attempts} "
                                                  f"reconnects failed: {last}")

    async def resume(self, policy: ResumePolicy) -> None:
        """Reconnect and resume the session: take the replies the server sends again, then send
        from the chunk its `resumed` names (the server has every chunk before it)."""
        reconnect = self._reconnect()
        assert self.token is not None
        sent_at = dict(self.inflight)
        last: Exception | None = None
        async for _ in _attempts(policy):
            try:
                await reconnect()
                await self.channel.send(encode(validated(ResumeRequest, {
                    "session_id": policy.session_id, "resume_token": self.token,
                    "resume_from": len(self.result.stats)})))
                next_k = await self._take_replayed(sent_at)
            except (ConnectionClosed, OSError) as e:
                last = e
                continue
            if isinstance(next_k, ServerError):
                last = next_k  # the server may not have parked it yet: try again
                continue
            self.result.resumes += 1
            self.next_k = next_k
            self.inflight.clear()  # the rest are sent again
            return
        if isinstance(last, ServerError):
            raise last
        raise ServerError(ErrorCode.SESSION_LOST, f"the socket dropped and {policy.attempts} resumes failed: {last}")

    async def _take_replayed(self, sent_at: dict[int, float]) -> int | ServerError:
        """After `resume`: the replies sent again, then the chunk `resumed` names, or the
        `unauthorized` error of a server that has not seen the old socket end yet."""
        while True:
            reply = await self.channel.receive(self.reply_timeout_s)
            k = len(self.result.stats)
            if isinstance(reply, FrameReply):
                self.take(reply, k, sent_at.get(k, self.clock()))
                self.result.replayed += 1
            elif isinstance(reply, ResumeOk):
                if reply.next_chunk_id != k:
                    raise BadReply(f"resumed at chunk {reply.next_chunk_id}, but {k} chunks were received")
                return reply.next_chunk_id
            elif isinstance(reply, ErrorReply) and reply.code is ErrorCode.UNAUTHORIZED:
                return ServerError.from_reply(reply)
            elif isinstance(reply, ErrorReply):
                raise ServerError.from_reply(reply)
            else:
                raise BadReply(f"expected `frame` or `resumed`, got `{reply.type}`")


async def _drain_rejected(channel: Channel, count: int, timeout_s: Optional[float]) -> None:
    """Read the replies of the requests sent after a rejected one: each must be an error.

    `session_lost` is expected there too: after a busy first chunk the server drops the
    session, and later chunks (without image and prompt) cannot restart it.
    """
    for _ in range(count):
        reply = await channel.receive(timeout_s)
        if isinstance(reply, FrameReply):
            raise ServerError(ErrorCode.BUSY, "the server rejected a chunk as busy but accepted a later one, "
                                              "so the session is out of order; use a smaller --pipeline")
        if isinstance(reply, ErrorReply) and reply.code not in (ErrorCode.BUSY, ErrorCode.SESSION_LOST):
            raise ServerError.from_reply(reply)
