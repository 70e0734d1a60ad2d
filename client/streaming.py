"""Stream a session's chunk requests with up to N in flight; collect video and per-chunk stats.

Replies come in request order (PROTOCOL.md), so the i-th reply answers the i-th request.
`busy` (no session slot yet, or the connection's pipeline is full) rejects a request without
starting it: the request and every later one still in flight are sent again after
`retry_after_s`. Should a later request have been accepted meanwhile, the session would be
out of order; that is reported, never silently played.
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
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Reply

DEFAULT_BUSY_TIMEOUT_S = 300.0


class Channel(Protocol):
    """What the streamer needs of a connection (`WorldClient` is one)."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self, timeout_s: Optional[float] = None) -> Reply: ...


@dataclass
class StreamResult:
    """The reassembled MP4 and the timing of every chunk."""

    started_at: float
    video: Fmp4Assembler = field(default_factory=Fmp4Assembler)
    stats: list[ChunkStat] = field(default_factory=list)

    def summary(self) -> StreamSummary:
        return StreamSummary.of(self.stats, self.started_at)


async def stream_session(channel: Channel, messages: Sequence[bytes], *, pipeline: int = 1,
                         on_chunk: Optional[Callable[[ChunkStat, FrameReply], None]] = None,
                         on_busy: Optional[Callable[[ServerError], None]] = None,
                         busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                         reply_timeout_s: Optional[float] = None,
                         clock: Callable[[], float] = time.perf_counter) -> StreamResult:
    """Send `messages` (packed infers of one session, in order), keeping up to `pipeline`
    in flight. Raises `ServerError` for an error reply (busy only after `busy_timeout_s`)."""
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    result = StreamResult(started_at=clock())
    inflight: deque[tuple[int, float]] = deque()  # (request index, sent at)
    next_k = 0
    busy_since: Optional[float] = None
    while next_k < len(messages) or inflight:
        while next_k < len(messages) and len(inflight) < pipeline:
            await channel.send(messages[next_k])
            inflight.append((next_k, clock()))
            next_k += 1
        reply = await channel.receive(reply_timeout_s)
        k, sent_at = inflight.popleft()
        if isinstance(reply, FrameReply):
            if reply.client_chunk_id is not None and reply.client_chunk_id != k:
                raise ServerError(ErrorCode.BAD_MESSAGE, f"expected chunk {k}, got {reply.client_chunk_id}")
            busy_since = None
            stat = ChunkStat(k, reply.num_frames, sent_at, clock(), dict(reply.stage_durations))
            result.video.append(reply.video)
            result.stats.append(stat)
            if on_chunk is not None:
                on_chunk(stat, reply)
        elif isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY:
            err = ServerError.from_reply(reply)
            busy_since = clock() if busy_since is None else busy_since
            if clock() - busy_since + err.retry_after_s > busy_timeout_s:
                raise err
            await _drain_rejected(channel, len(inflight), reply_timeout_s)
            inflight.clear()
            next_k = k
            if on_busy is not None:
                on_busy(err)
            await asyncio.sleep(err.retry_after_s)
        elif isinstance(reply, ErrorReply):
            raise ServerError.from_reply(reply)
        else:
            raise ServerError(ErrorCode.BAD_MESSAGE, f"expected a `frame` reply, got `{reply.type}`")
    return result


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
