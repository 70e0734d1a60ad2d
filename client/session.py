"""WorldClient: one WebSocket to `/v1/realtime/world/camera`, one method per protocol action.

Requests are validated and packed by `protocol` (the same models the server decodes with),
so a bad input fails here with the code the server would answer. Replies are checked before
they are used (client/reply_guard.py: `BadReply`), and every wait for one is bounded
(`ReplyTimeout`): `reply_timeout_s` of silence, `queue_timeout_s` in the server's line.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import websockets
from websockets.exceptions import ConnectionClosed

from client.errors import BadReply, ReplyTimeout, ServerError
from client.reply_guard import DEFAULT_REPLY_MAX_BYTES, ReplyGuard, limit_frames, reply_max_bytes
from client.streaming import StreamResult, stream_session
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import (AckRequest, CameraServerConfig, ControlRequest, ErrorReply, Forked, ForkRequest, FrameReply,
                               InferRequest, Opened, OpenRequest, Queued, Reopened, ReopenRequest, Reply, ResetOk,
                               ResetRequest, Rewound, RewindRequest, Saved, SaveRequest, ShareRequest, UnshareRequest)
from protocol.sharing import Shared, Unshared
from protocol.requests import SessionStart, drive_request, infer_request

CAMERA_PATH = "/v1/realtime/world/camera"
DEFAULT_URL = f"ws://127.0.0.1:8000{CAMERA_PATH}"
URL_ENV = "LWF_URL"  # the server's address when none is given (lwf-client's --url, the clients' url)
HANDSHAKE_TIMEOUT_S = 30.0
RESET_TIMEOUT_S = 5.0
BRANCH_TIMEOUT_S = 120.0  # a fork or rewind replays the kept chunks on the server first
# The longest a reply may take: above the server's own bounds on a slow one (a rebuild after a
# replica loss waits up to `sessions.recovery_timeout_s`, 120 s, for room, then replays up to
# ~150 s at the chunk cap on an H200: docs/RELIABILITY.md).
DEFAULT_REPLY_TIMEOUT_S = 300.0
# The longest a session waits in the server's line (`queued` notices, each within the reply
# timeout of the last), from the first notice of a wait.
DEFAULT_QUEUE_TIMEOUT_S = 1800.0


def default_url() -> str:
    """`$LWF_URL` when set, else the local server's camera route."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def camera_url(url: str) -> str:
    """Normalise a server address: http(s) -> ws(s); a bare host gets the camera path."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"--url must be ws://, wss://, http:// or https://, got {url!r}")
    path = parts.path if parts.path not in ("", "/") else CAMERA_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class WorldClient:
    """Async client of one connection. Use `await WorldClient.connect(url)` or `async with`.

    `reply_timeout_s` bounds each wait for a reply (`receive`'s default), `queue_timeout_s` a
    wait in the server's line; both raise `ReplyTimeout`. A reply this client cannot take
    raises `BadReply` (client/reply_guard.py)."""

    def __init__(self, ws: websockets.ClientConnection, config: CameraServerConfig,
                 reopen: Optional[Callable[[ReplyGuard], Awaitable[tuple[websockets.ClientConnection,
                                                                          CameraServerConfig]]]] = None, *,
                 guard: Optional[ReplyGuard] = None, reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S) -> None:
        self._ws = ws
        self._reopen = reopen
        self.config = config  # the server's handshake
        self._guard = guard or ReplyGuard()
        self._guard.config = config
        self.reply_timeout_s = reply_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self.notices: list[ErrorReply] = []  # session_limit and yielded notices received (see `receive`)
        self.queued: Optional[Queued] = None  # the last `queued` notice: the session waits in the server's line
        self.on_queued: Optional[Callable[[Queued], None]] = None  # told of each `queued` notice
        self._auto_ack: set[str] = set()  # driven sessions whose frames `receive` acks (see `drive`)
        self._event_ids = itertools.count(1)  # `control` event ids when the caller gives none

    @classmethod
    async def connect(cls, url: Optional[str] = None, api_key: Optional[str] = None,
                      open_timeout_s: float = HANDSHAKE_TIMEOUT_S, *,
                      reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
                      queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S) -> WorldClient:
        """Open the socket and read the handshake; `ServerError` when the server refuses.
        `url`: default `$LWF_URL`, else the local server (`default_url`)."""
        reopen = partial(cls._open, url or default_url(), api_key, open_timeout_s)
        guard = ReplyGuard()
        return cls(*await reopen(guard), reopen=reopen, guard=guard, reply_timeout_s=reply_timeout_s,
                   queue_timeout_s=queue_timeout_s)

    async def reconnect(self) -> None:
        """A new socket to the same server in place of this one (after a drop: then `resume`)."""
        if self._reopen is None:
            raise ServerError(ErrorCode.SESSION_LOST, "this client was not opened with `connect`: cannot reconnect")
        await self._ws.close()
        self._ws, self.config = await self._reopen(self._guard)
        self._guard.config = self.config

    @staticmethod
    async def _open(url: str, api_key: Optional[str], open_timeout_s: float,
                    guard: ReplyGuard) -> tuple[websockets.ClientConnection, CameraServerConfig]:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        ws = await websockets.connect(camera_url(url), max_size=DEFAULT_REPLY_MAX_BYTES, additional_headers=headers,
                                      open_timeout=open_timeout_s)
        try:
            try:
                async with asyncio.timeout(open_timeout_s):  # not wait_for: 3.11's can swallow a Ctrl-C
                    data = await ws.recv()
            except TimeoutError:
                raise ReplyTimeout(f"the server accepted the socket but sent no handshake within "
                                   f"{open_timeout_s:g} s", open_timeout_s) from None
            except ConnectionClosed as e:
                too_big = _too_big(e, DEFAULT_REPLY_MAX_BYTES)
                if too_big is not None:
                    raise too_big from None
                raise
            first = guard.take(data)
        except BaseException:
            await ws.close()
            raise
        if isinstance(first, ErrorReply):  # e.g. unauthorized, then the server closes
            await ws.close()
            raise ServerError.from_reply(first)
        if not isinstance(first, CameraServerConfig):
            await ws.close()
            raise BadReply(f"expected the config handshake, got `{first.type}`")
        limit_frames(ws, reply_max_bytes(first))  # the handshake's limits from here on
        return ws, first

    async def __aenter__(self) -> WorldClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, data: bytes) -> None:
        """Send one packed request (see `send_infer` / `send_reset`)."""
        self._guard.sent(data)  # the sessions it names: replies for others are refused
        await self._ws.send(data)

    async def receive(self, timeout_s: Optional[float] = None) -> Reply:
        """The next reply in order: FrameReply, ResetOk or ErrorReply (errors are not raised).

        Notices answer no request and are skipped: `session_limit` with `chunks_left` > 0 (the
        next chunk is the session's last) and `yielded` (the session gave its place to the
        line; its next infer waits in line) are kept in `self.notices`; `queued` (the session
        waits in the server's line for a place: its position and ETA) in `self.queued`, and
        `self.on_queued` is told. `timeout_s` (default `reply_timeout_s`) bounds the wait for the
        reply; notices do not extend it, but while `queued` notices come (every few seconds,
        each within `timeout_s` of the last) the wait is bounded by `queue_timeout_s` from the
        first. `ReplyTimeout` past either; `BadReply` for a reply this client cannot take."""
        limit = self.reply_timeout_s if timeout_s is None else timeout_s
        return await self._receive(asyncio.get_running_loop().time() + limit, limit)

    async def _receive(self, deadline: float, limit: float) -> Reply:
        loop = asyncio.get_running_loop()
        started, in_line, line_bound = loop.time(), None, False  # in_line: the wait's first `queued`
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result and drops a
            # cancellation (Ctrl-C) that comes as the frame arrives
            try:
                async with asyncio.timeout_at(deadline):
                    data = await self._ws.recv()
            except TimeoutError:
                waited = loop.time() - started
                if line_bound:
                    where = "" if self.queued is None else f" (position {self.queued.position} when last told)"
                    raise ReplyTimeout(f"waited {waited:.0f} s in the server's line without a place{where}, the "
                                       "queue timeout", waited, in_line=True) from None
                raise ReplyTimeout(f"no reply from the server within {limit:g} s, the reply timeout", waited) from None
            except ConnectionClosed as e:
                too_big = _too_big(e, self._guard.max_bytes)
                if too_big is not None:
                    raise too_big from None
                raise
            reply = self._guard.take(data)
            if isinstance(reply, ErrorReply) and reply.is_notice:
                self.notices.append(reply)
                continue
            if isinstance(reply, Queued):
                self.queued = reply
                now = loop.time()
                in_line = now if in_line is None else in_line
                line_bound = in_line + self.queue_timeout_s < now + limit
                deadline = min(now + limit, in_line + self.queue_timeout_s)
                if self.on_queued is not None:
                    self.on_queued(reply)
                continue
            if isinstance(reply, FrameReply) and reply.session_id in self._auto_ack:
                await self.ack(reply.session_id, reply.chunk_id)
            return reply

    async def send_infer(self, request: InferRequest) -> None:
        """Queue one chunk without waiting (pipelining); `protocol.requests.infer_request` builds it."""
        await self.send(encode(request))

    async def infer(self, session_id: str, poses: np.ndarray, intrinsics: np.ndarray, *,
                    start: Optional[SessionStart] = None, prompt_update: Optional[str] = None,
                    timeout_s: Optional[float] = None) -> FrameReply:
        """Request the next chunk (`start` on a session's first) and wait for it; `ServerError`
        on an error reply. Replies come in request order: call this only when no other request
        is in flight."""
        await self.send_infer(infer_request(session_id, poses, intrinsics, start=start, prompt_update=prompt_update))
        return _expect(await self.receive(timeout_s), FrameReply)

    async def stream(self, messages: Sequence[bytes], *, pipeline: int = 1, **options) -> StreamResult:
        """Send a session's packed infers (e.g. `SessionPlan.messages`) with up to `pipeline` in
        flight; the reassembled video and per-chunk stats. Options as `stream_session`."""
        return await stream_session(self, messages, pipeline=pipeline, **options)

    async def drive(self, session_id: str, start: SessionStart, *, auto_ack: bool = True) -> None:
        """Open a session the server runs by itself (`drive`, PROTOCOL.md): its frames come as
        the keys held (`control`) move the camera, `paused` while none is. With `auto_ack`
        (the default) `receive` acks every frame of it as it reads it; else call `ack`."""
        await self.send(encode(drive_request(session_id, start)))
        if auto_ack:
            self._auto_ack.add(session_id)
        else:
            self._auto_ack.discard(session_id)

    async def control(self, session_id: str, keys: Iterable[str], event_id: Optional[int] = None) -> int:
        """Set the keys held (the whole state; `[]` releases all); the event id sent (the next
        of this client's counter when none is given): frames made with it carry it."""
        event = next(self._event_ids) if event_id is None else int(event_id)
        await self.send(encode(validated(ControlRequest, {"session_id": session_id, "event_id": event,
                                                          "keys": list(keys)})))
        return event

    async def ack(self, session_id: str, chunk_id: int) -> None:
        """Tell the server the frames of a driven session up to `chunk_id` arrived."""
        await self.send(encode(validated(AckRequest, {"session_id": session_id, "chunk_id": int(chunk_id)})))

    async def infer_keys(self, session_id: str, *, start: Optional[SessionStart] = None,
                         prompt_update: Optional[str] = None, timeout_s: Optional[float] = None) -> FrameReply:
        """The next chunk with its poses from the keys held (`from_keys`; `start` on a session's
        first). Nothing else in flight."""
        await self.send_infer(infer_request(session_id, from_keys=True, start=start, prompt_update=prompt_update))
        return _expect(await self.receive(timeout_s), FrameReply)

    async def fork(self, session_id: str, new_session_id: str, at_chunk: int,
                   timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Forked:
        """A new session `new_session_id` on this connection from `session_id`'s first `at_chunk`
        chunks (its next infer produces chunk `at_chunk`); `ServerError` when refused (`busy`
        while a chunk is in flight: call this between chunks)."""
        await self.send(encode(validated(ForkRequest, {"session_id": session_id, "new_session_id": new_session_id,
                                                       "at_chunk": int(at_chunk)})))
        return _expect(await self.receive(timeout_s), Forked)

    async def rewind(self, session_id: str, to_chunk: int, timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Rewound:
        """Take `session_id` back to its state after chunk `to_chunk` - 1: its next infer produces
        chunk `to_chunk` again. `ServerError` when refused (nothing changed then)."""
        await self.send(encode(validated(RewindRequest, {"session_id": session_id, "to_chunk": int(to_chunk)})))
        return _expect(await self.receive(timeout_s), Rewound)

    async def save(self, session_id: str, title: str = "", timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Saved:
        """Save the session this connection holds as a world of its own on the server (its chunks
        so far): `saved.world_id`. `ServerError` when refused (a server without worlds)."""
        await self.send(encode(validated(SaveRequest, {"session_id": session_id, "title": title})))
        async with asyncio.timeout(timeout_s):
            return _expect(await self.receive(), Saved)

    async def open(self, world_id: str, session_id: str, timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Opened:
        """Open a saved world of the caller's as session `session_id` (in place of the current
        one): its next infer produces `opened.next_chunk_id`. `ServerError` when refused."""
        await self.send(encode(validated(OpenRequest, {"session_id": session_id, "world_id": world_id})))
        async with asyncio.timeout(timeout_s):
            return _expect(await self.receive(), Opened)

    async def share(self, session_id: str, audience: str = "link", controls: str = "owner",
                    timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Shared:
        """Share the session this connection holds as a world others watch (PROTOCOL.md "share /
        unshare"): `shared.world_id`, `shared.watch_token` (`audience` `link`: whoever holds it;
        `principal`: this API key only). Between chunks: replies come in request order."""
        await self.send(encode(validated(ShareRequest, {"session_id": session_id, "audience": audience,
                                                        "controls": controls})))
        async with asyncio.timeout(timeout_s):
            return _expect(await self.receive(), Shared)

    async def unshare(self, session_id: str, timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Unshared:
        """End the session's share: its token opens nothing any more, its viewers get `ended`."""
        await self.send(encode(validated(UnshareRequest, {"session_id": session_id})))
        async with asyncio.timeout(timeout_s):
            return _expect(await self.receive(), Unshared)
    async def reopen(self, world_id: str, session_id: str, timeout_s: Optional[float] = BRANCH_TIMEOUT_S) -> Reopened:
        """Run a saved world's inputs again through the served model as the new session
        `session_id` (for a world `open` refuses as `world_changed`): `reopened.chunks` frame
        replies follow (`receive` them), new chunks from chunk 0. `ServerError` when refused."""
        await self.send(encode(validated(ReopenRequest, {"session_id": session_id, "world_id": world_id})))
        async with asyncio.timeout(timeout_s):
            return _expect(await self.receive(), Reopened)

    async def send_reset(self, session_id: str) -> None:
        self._auto_ack.discard(session_id)
        await self.send(encode(validated(ResetRequest, {"session_id": session_id})))

    async def reset(self, session_id: str, timeout_s: Optional[float] = RESET_TIMEOUT_S) -> ResetOk:
        """Drop the session on the server. Replies of chunks still in flight are discarded."""
        await self.send_reset(session_id)
        limit = self.reply_timeout_s if timeout_s is None else timeout_s
        deadline = asyncio.get_running_loop().time() + limit
        while True:
            reply = await self._receive(deadline, limit)
            if isinstance(reply, (ResetOk, ErrorReply)):
                return _expect(reply, ResetOk)

    async def close(self) -> None:
        await self._ws.close()


def _expect(reply: Reply, kind: type) -> Reply:
    if isinstance(reply, ErrorReply):
        raise ServerError.from_reply(reply)
    if not isinstance(reply, kind):
        raise BadReply(f"expected `{kind.__name__}`, got `{reply.type}`")
    return reply


def _too_big(closed: ConnectionClosed, limit: int) -> Optional[BadReply]:
    """The socket closed because the server's frame was over `limit`: websockets refused it
    unread and closed with 1009 (a 1009 the server sent first is about this client's frame)."""
    sent = closed.sent
    if sent is None or sent.code != 1009 or closed.rcvd_then_sent:
        return None
    return BadReply(f"a reply over the {limit} bytes this server's handshake allows (the socket was closed "
                    "without reading it)")
