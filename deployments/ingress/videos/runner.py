"""SessionRunner: one offline session through a `Connection`, in the ingress process.

The runner is the client of a Connection served on a `LocalTransport` (no socket): it sends
the session's chunk requests with up to `pipeline` in flight, the way `lwf-client play` does,
and joins the fMP4 payloads of the replies into one MP4. So `POST /v1/videos` runs the code
that serves the WebSocket (lanes, admission, recovery, quotas) and its video equals the
streamed one. Its sessions are offline ones (`SessionOptions.offline`): the replicas run their
chunks in the live sessions' gaps and bound them apart (`sessions.max_offline_sessions`).

A `busy` reply (no session slot yet, a per-key quota) rejects a request without starting it:
the runner reads the replies of the requests sent after it (refused with it), waits
`retry_after_s` and sends again from the refused one, for up to `busy_timeout_s` in all; then
the busy becomes the HTTP answer. Any other error reply ends the run with its code.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Optional

from deployments.ingress.transport import LocalTransport, Transport, TransportClosed
from deployments.ingress.videos.errors import HttpError
from protocol.codec import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, Queued, Reply

# Serves one accepted transport for an API key id (None: auth off) until the client leaves.
ServeConnection = Callable[[Transport, Optional[str]], Awaitable[None]]


class SessionRunner:
    """Runs sessions given as packed infer requests; returns their MP4 bytes."""

    def __init__(self, serve_connection: ServeConnection, pipeline: int, busy_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if pipeline < 1:
            raise ValueError(f"pipeline must be >= 1, got {pipeline}")
        self._serve = serve_connection
        self._pipeline = pipeline
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock

    async def run(self, messages: Sequence[bytes], key_id: Optional[str] = None,
                  on_chunk: Optional[Callable[[int], None]] = None) -> bytes:
        """The MP4 of the session `messages` (chunk k's reply calls `on_chunk(k)`); `HttpError`
        for an error reply or a connection the server closed."""
        transport = LocalTransport(offline=True)  # a job: the replicas serve live sessions first
        handler = asyncio.create_task(self._serve(transport, key_id))
        try:
            hello = await self._reply(transport)
            if not isinstance(hello, CameraServerConfig):
                raise HttpError.other(500, "internal", f"expected the config handshake, got `{hello.type}`")
            return await self._stream(transport, messages, on_chunk)
        except TransportClosed as e:
            raise HttpError.other(500, "internal", f"the server closed the session's connection: {e.reason}") from None
        finally:
            transport.hang_up()  # the Connection releases the session on every deployment
            await asyncio.gather(handler, return_exceptions=True)

    async def _stream(self, transport: LocalTransport, messages: Sequence[bytes],
                      on_chunk: Optional[Callable[[int], None]]) -> bytes:
        parts: list[bytes] = []
        inflight: deque[int] = deque()  # request indices, in reply order
        next_k = 0
        busy_until: Optional[float] = None
        while next_k < len(messages) or inflight:
            while next_k < len(messages) and len(inflight) < self._pipeline:
                transport.push(messages[next_k])
                inflight.append(next_k)
                next_k += 1
            reply = await self._reply(transport)
            k = inflight.popleft()
            if isinstance(reply, FrameReply):
                if reply.client_chunk_id is not None and reply.client_chunk_id != k:
                    raise HttpError.other(500, "internal", f"expected chunk {k}, got {reply.client_chunk_id}")
                parts.append(reply.video)
                busy_until = None
                if on_chunk is not None:
                    on_chunk(k)
                continue
            if not isinstance(reply, ErrorReply):
                raise HttpError.other(500, "internal", f"expected a `frame` reply, got `{reply.type}`")
            if reply.code is not ErrorCode.BUSY:
                raise HttpError.of(reply.code, reply.message)
            busy_until = self._clock() + self._busy_timeout_s if busy_until is None else busy_until
            if self._clock() + reply.retry_after_s > busy_until:
                raise HttpError.of(reply.code, reply.message, reply.retry_after_s)
            for _ in inflight:  # sent after the refused request: refused with it
                if isinstance(await self._reply(transport), FrameReply):
                    raise HttpError.other(500, "internal", "a chunk was accepted after a refused one")
            inflight.clear()
            next_k = k
            await asyncio.sleep(reply.retry_after_s)
        return b"".join(parts)

    @staticmethod
    async def _reply(transport: LocalTransport) -> Reply:
        """The next reply; notices (`session_limit`, `queued`: no request failed) are skipped."""
        while True:
            reply = decode_reply(await transport.reply())
            if not (isinstance(reply, ErrorReply) and reply.is_notice) and not isinstance(reply, Queued):
                return reply
