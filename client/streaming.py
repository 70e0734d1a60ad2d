"""Stream a session's chunk requests with up to N in flight; collect video and per-chunk stats.

Replies come in request order (PROTOCOL.md), so the i-th reply answers the i-th request.
`busy` (no session slot yet, or the connection's pipeline is full) rejects a request without
starting it: the request and every later one still in flight are sent again after
`retry_after_s`. Should a later request have been accepted meanwhile, the session would be
out of order; that is reported, never silently played.

With a `ResumePolicy` a dropped socket does not end the session: the channel reconnects, sends
`resume` with the session's token (its first frame reply's) and the count of replies it has,
takes the replies it missed, and sends again from the chunk the server's `resumed` names
(docs/SERVING.md, Resume). The video is the one an uninterrupted session would have given.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

from client.errors import ServerError
from client.stats import ChunkStat, StreamSummary
from media.reassembly import Fmp4Assembler
from websockets.exceptions import ConnectionClosed

from protocol.codec import encode_resume
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Reply, ResumeOk

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

    def summary(self) -> StreamSummary:
        return StreamSummary.of(self.stats, self.started_at)


async def stream_session(channel: Channel, messages: Sequence[bytes], *, pipeline: int = 1,
                         on_chunk: Optional[Callable[[ChunkStat, FrameReply], None]] = None,
                         on_busy: Optional[Callable[[ServerError], None]] = None,
                         busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                         reply_timeout_s: Optional[float] = None,
                         clock: Callable[[], float] = time.perf_counter,
                         resume: Optional[ResumePolicy] = None) -> StreamResult:
    """Send `messages` (packed infers of one session, in order), keeping up to `pipeline`
    in flight. Raises `ServerError` for an error reply (busy only after `busy_timeout_s`).
    `resume`: survive dropped sockets (the channel must be `Reconnectable`)."""
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    result = StreamResult(started_at=clock())
    inflight: deque[tuple[int, float]] = deque()  # (request index, sent at)
    next_k = 0
    busy_since: Optional[float] = None
    token: Optional[str] = None

    def take(reply: FrameReply, k: int, sent_at: float) -> None:
        nonlocal token
        if reply.client_chunk_id is not None and reply.client_chunk_id != k:
            raise ServerError(ErrorCode.BAD_MESSAGE, f"expected chunk {k}, got {reply.client_chunk_id}")
        token = reply.resume_token or token
        stat = ChunkStat(k, reply.num_frames, sent_at, clock(), dict(reply.stage_durations))
        result.video.append(reply.video)
        result.stats.append(stat)
        if on_chunk is not None:
            on_chunk(stat, reply)

    while next_k < len(messages) or inflight:
        try:
            busy_since, next_k = await _turn(channel, messages, pipeline, inflight, next_k, busy_since, take,
                                             on_busy, busy_timeout_s, reply_timeout_s, clock)
        except ConnectionClosed:
            if resume is None or token is None:  # not resumable (before chunk 0, or not asked)
                raise
            next_k = await _resume(channel, resume, token, result, inflight, take, reply_timeout_s, clock)
            inflight.clear()  # the server has every chunk before next_k; the rest are sent again
    return result


async def _turn(channel: Channel, messages: Sequence[bytes], pipeline: int, inflight: deque, next_k: int,
                busy_since: Optional[float], take: Callable[[FrameReply, int, float], None],
                on_busy: Optional[Callable[[ServerError], None]], busy_timeout_s: float,
                reply_timeout_s: Optional[float], clock: Callable[[], float]) -> tuple[Optional[float], int]:
    """Fill the pipeline, then handle one reply: (busy_since, next_k) afterwards."""
    while next_k < len(messages) and len(inflight) < pipeline:
        await channel.send(messages[next_k])
        inflight.append((next_k, clock()))
        next_k += 1
    reply = await channel.receive(reply_timeout_s)
    k, sent_at = inflight[0]
    if isinstance(reply, FrameReply):
        inflight.popleft()
        take(reply, k, sent_at)
        return None, next_k
    if isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY:
        err = ServerError.from_reply(reply)
        busy_since = clock() if busy_since is None else busy_since
        if clock() - busy_since + err.retry_after_s > busy_timeout_s:
            raise err
        await _drain_rejected(channel, len(inflight) - 1, reply_timeout_s)
        inflight.clear()
        if on_busy is not None:
            on_busy(err)
        await asyncio.sleep(err.retry_after_s)
        return busy_since, k
    if isinstance(reply, ErrorReply):
        raise ServerError.from_reply(reply)
    raise ServerError(ErrorCode.BAD_MESSAGE, f"expected a `frame` reply, got `{reply.type}`")


async def _resume(channel: Channel, policy: ResumePolicy, token: str, result: StreamResult, inflight: deque,
                  take: Callable[[FrameReply, int, float], None], timeout_s: Optional[float],
                  clock: Callable[[], float]) -> int:
    """Reconnect and resume the session: take the replies the server sends again, return the
    chunk its `resumed` names (the next one to send)."""
    reconnect = getattr(channel, "reconnect", None)
    if reconnect is None:
        raise ServerError(ErrorCode.SESSION_LOST, "the socket dropped and this channel cannot reconnect")
    sent_at = dict(inflight)
    last: Exception | None = None
    for attempt in range(policy.attempts):
        if attempt:
            await asyncio.sleep(policy.backoff_s * 2 ** (attempt - 1))
        try:
            await reconnect()
            await channel.send(encode_resume(policy.session_id, token, resume_from=len(result.stats)))
            while True:
                reply = await channel.receive(timeout_s)
                k = len(result.stats)
                if isinstance(reply, FrameReply):
                    take(reply, k, sent_at.get(k, clock()))
                    result.replayed += 1
                elif isinstance(reply, ResumeOk):
                    if reply.next_chunk_id != k:
                        raise ServerError(ErrorCode.BAD_MESSAGE, f"resumed at chunk {reply.next_chunk_id}, "
                                                                 f"but {k} chunks were received")
                    result.resumes += 1
                    return reply.next_chunk_id
                elif isinstance(reply, ErrorReply) and reply.code is ErrorCode.UNAUTHORIZED:
                    last = ServerError.from_reply(reply)  # the server may not have parked it yet
                    break
                elif isinstance(reply, ErrorReply):
                    raise ServerError.from_reply(reply)
                else:
                    raise ServerError(ErrorCode.BAD_MESSAGE, f"expected `frame` or `resumed`, got `{reply.type}`")
        except (ConnectionClosed, OSError) as e:
            last = e
    if isinstance(last, ServerError):
        raise last
    raise ServerError(ErrorCode.SESSION_LOST, f"the socket dropped and {policy.attempts} resumes failed: {last}")


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
