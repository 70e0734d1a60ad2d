"""Watching a world someone shares (PROTOCOL.md "The watch route"): where a link points
(`watch_target`) and the viewer's socket (async `Watcher`; its synchronous face is
client/sync.py's `SyncWatch`, from `SyncWorldClient.watch` or `watch`).

A viewer sends `watch {world_id, watch_token}` (the token in a message, never in a URL), gets
`watching`, then the world's frame replies (the owner's fMP4 bytes; the first starts with the
init segment) and `world` notices; `ended` is the last, then the server closes the socket.
Every reply is checked (client/reply_guard.py `WatchGuard`: `BadReply`).
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

import websockets
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

from client.errors import ReplyTimeout, ServerError
from client.reply_guard import DEFAULT_REPLY_MAX_BYTES, WatchGuard
from client.session import CAMERA_PATH, HANDSHAKE_TIMEOUT_S, _too_big, default_url
from protocol.codec import encode
from protocol.messages import ErrorReply, FrameReply
from protocol.sharing import MAX_WORLD_ID_CHARS, WatchRequest, Watching, WorldNotice

WATCH_PATH = "/v1/realtime/world/watch"
PAGE_PATH = "/w/"  # the viewer page: <server>/w/<world_id>#token=<watch_token>
WORLD_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_WORLD_ID_CHARS}}}")


@dataclass(frozen=True)
class WatchTarget:
    url: str  # ws(s)://host[/prefix]/v1/realtime/world/watch
    world_id: str
    token: str


def watch_target(link: str, token: Optional[str] = None, server: Optional[str] = None) -> WatchTarget:
    """Where to watch, from a share link (`<server>/w/<world_id>#token=<token>`, as the page
    copies it), a `watch_url` (`[<server>]/v1/realtime/world/watch?world=<world_id>`: the
    `shared` answer's, a path, joined to `server`) with `token`, or a world id with `server`
    and `token`. `server`: default `$LWF_URL`, else the local server. ValueError otherwise."""
    parts = urlsplit(link)
    path, linked = parts.path.rstrip("/"), parse_qs(parts.fragment).get("token", [None])[0]
    head, page, tail = path.rpartition(PAGE_PATH)
    if page and tail and "/" not in tail:
        prefix, world_id = head, tail
    elif path.endswith(WATCH_PATH):
        prefix, world_id = path[: -len(WATCH_PATH)], parse_qs(parts.query).get("world", [""])[0]
    elif not parts.scheme and WORLD_ID.fullmatch(link):
        prefix, world_id = None, link
    else:
        raise ValueError(f"{link!r} is neither a share link (.../w/WORLD#token=TOKEN) nor a watch URL "
                         f"(...{WATCH_PATH}?world=WORLD)")
    if not WORLD_ID.fullmatch(world_id):
        raise ValueError(f"{link!r} names no world id (letters, digits, - and _, at most {MAX_WORLD_ID_CHARS})")
    if token is not None and linked is not None and token != linked:
        raise ValueError("the link carries another token than the one given")
    token = token if token is not None else linked
    if not token:
        raise ValueError("no watch token: give the share link with its #token=..., or the token")
    if not parts.scheme or not parts.netloc or prefix is None:  # a path or an id: on `server`
        base = urlsplit(server or default_url())
        scheme, netloc = base.scheme, base.netloc
        prefix = base.path.rstrip("/").removesuffix(CAMERA_PATH).rstrip("/") + (prefix or "")
    else:
        scheme, netloc = parts.scheme, parts.netloc
    scheme = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    if scheme not in ("ws", "wss") or not netloc:
        raise ValueError(f"cannot tell the server of {link!r}: a ws://, wss://, http:// or https:// address is needed")
    return WatchTarget(urlunsplit((scheme, netloc, prefix + WATCH_PATH, "", "")), world_id, token)


class Watcher:
    """One viewer's socket (async). `await Watcher.open(target)`; then `next()` (or `async for`)
    gives the frame replies and `world` notices in order, `None` once the world ended and the
    server closed the socket. `ServerError` when the server refuses the watch (`unauthorized`:
    a wrong, revoked or foreign token, or the key; `busy`: a limit); `BadReply` for a reply
    this viewer refuses; `ReplyTimeout` when nothing came for `idle_timeout_s` (None: no bound;
    a paused world sends nothing); websockets' `ConnectionClosed` when the socket dropped."""

    def __init__(self, ws: websockets.ClientConnection, guard: WatchGuard, watching: Watching,
                 idle_timeout_s: Optional[float]) -> None:
        self._ws = ws
        self._guard = guard
        self.watching = watching
        self.viewers = watching.viewers
        self.idle_timeout_s = idle_timeout_s
        self.ended: Optional[WorldNotice] = None

    @classmethod
    async def open(cls, target: WatchTarget, api_key: Optional[str] = None, *,
                   open_timeout_s: float = HANDSHAKE_TIMEOUT_S, idle_timeout_s: Optional[float] = None,
                   max_bytes: int = DEFAULT_REPLY_MAX_BYTES) -> Watcher:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        guard = WatchGuard(target.world_id, max_bytes)
        ws = await websockets.connect(target.url, max_size=max_bytes, additional_headers=headers,
                                      open_timeout=open_timeout_s)
        try:
            await ws.send(encode(WatchRequest(world_id=target.world_id, watch_token=target.token)))
            try:
                async with asyncio.timeout(open_timeout_s):
                    first = guard.take(await ws.recv())
            except TimeoutError:
                raise ReplyTimeout(f"no answer to `watch` within {open_timeout_s:g} s", open_timeout_s) from None
        except BaseException:
            await ws.close()
            raise
        if isinstance(first, ErrorReply):
            await ws.close()
            raise ServerError.from_reply(first)
        return cls(ws, guard, first, idle_timeout_s)

    async def next(self) -> Optional[FrameReply | WorldNotice]:
        if self.ended is not None:
            await self._ws.close()
            return None
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                data = await self._ws.recv()
        except TimeoutError:
            raise ReplyTimeout(f"nothing from the world for {self.idle_timeout_s:g} s", self.idle_timeout_s) from None
        except ConnectionClosedOK:
            return None  # closed without `ended` (e.g. by this viewer): nothing more comes
        except ConnectionClosed as e:
            too_big = _too_big(e, self._guard.max_bytes)  # a frame over the bound, refused unread
            if too_big is not None:
                raise too_big from None
            raise
        reply = self._guard.take(data)
        if isinstance(reply, ErrorReply):  # a viewer sends nothing after `watch`: no request to refuse
            raise ServerError.from_reply(reply)
        if isinstance(reply, WorldNotice):
            self.viewers = reply.viewers
            if reply.event == "ended":
                self.ended = reply
        return reply

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> FrameReply | WorldNotice:
        reply = await self.next()
        if reply is None:
            raise StopAsyncIteration
        return reply

    async def close(self) -> None:
        await self._ws.close()
