"""Sharing: a connection's part in the worlds it shares (the owner's side; hub.py, book.py).

The connection attaches to a world as its owner: `share` makes (or answers) the world of its
current session, each frame reply of that session that the send loop sent goes to the hub
(the same fMP4 bytes, without the owner's own fields: resume token, client ids, timings,
debug), and the session's end ends the world. One publisher task per shared session sends its
chunks to the hub one call at a time (so in order), at most `PUBLISH_BACKLOG` behind: if the
hub is slower, the oldest unsent chunk is dropped (viewers skip it), and the owner's replies
never wait for it. Between chunks it tells the hub that the owner is there (keep-alive).
In the chunks' order it also sends the session's notes (`WorldNote`): `paused` when a driven
session's `paused` was sent, `resumed` before its next chunk, and, only when the share has
`show_prompt`, `prompt` with the new text before the first chunk that attends to it.

The owner also names its world's players (`grant`, `revoke`, `kick`, `pass_controls`: the hub
answers `players`); an `Inbox` per shared session (inbox.py) keeps the players' inputs the
connection's ControlBook reads per chunk.

When the socket ends with the session parked for a resume, its world waits (viewers get
`owner_reconnecting`); a resume on another socket (any ingress replica) attaches that
connection to the world again (`owner_back`). A session the socket's end releases ends it.
While it publishes a session, it also answers the forks of its world's head (fork_source.py).
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Optional

from collections.abc import Callable

from pydantic import BaseModel
from ray.serve.handle import DeploymentHandle

from deployments.config import AppArgs
from deployments.errors import ReplicaError, SessionLost
from deployments.ingress.detached import detach, settle
from deployments.ingress.sharing.book import WorldChunk
from deployments.ingress.sharing.fork_source import ForkSources, world_head
from deployments.ingress.sharing.inbox import Inbox
from deployments.ingress.sharing.policy import OWNER, PlayerInputs
from deployments.ingress.stream import Stream, StreamState
from deployments.log import KeyValueLog
from media.reassembly import split_init
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import (AskControlsRequest, ErrorReply, FrameReply, GrantRequest, KickRequest,
                               PassControlsRequest, Paused, PromptRequest, Request, RevokeRequest, ShareRequest,
                               UnshareRequest)
from protocol.sharing import Players, Shared, Unshared

WATCH_ROUTE = "/v1/realtime/world/watch"
PUBLISH_BACKLOG = 4  # chunks of one world waiting for the hub, at most
HUB_TIMEOUT_S = 10.0
AWAY_MARGIN_S = 5.0  # beyond the resume grace: the parking's own sweep frees the session first


def world_chunk(reply: FrameReply) -> WorldChunk:
    """What viewers get of the owner's frame reply: the same video bytes, nothing private."""
    return WorldChunk(chunk_id=reply.chunk_id, video=reply.video, num_frames=reply.num_frames,
                      resolution=tuple(reply.resolution), fps=reply.fps, mime_type=reply.mime_type,
                      digest=hashlib.blake2b(reply.video, digest_size=16).hexdigest(), event_id=reply.event_id,
                      player=reply.player, voters=None if reply.voters is None else tuple(reply.voters))


def players_of(session_id: str, inputs: PlayerInputs, notice: bool = False) -> Players:
    """The owner's `players` message of its world's roles and viewers (the hub's `inputs`)."""
    holder = None if inputs.controls == "crowd" else (inputs.holder or OWNER)
    return Players(session_id=session_id, world_id=inputs.world_id, controls=inputs.controls, holder=holder,
                   players=list(inputs.players), director=inputs.director, viewers=len(inputs.viewers),
                   viewer_ids=list(inputs.viewers), version=inputs.version, notice=notice)


def chunk_prompt(stream: Stream, chunk_id: int) -> str:
    """The prompt chunk `chunk_id` of `stream` attended to (its prompt updates, journal.py)."""
    return stream.journal.prompt_after(chunk_id + 1, stream.spec.prompt)


@dataclass(frozen=True, slots=True)
class WorldNote:
    """A notice of the owner's session, in its chunks' order: `prompt` (with the prompt the
    chunks after it attend to), `paused`, `resumed` (book.py `note`)."""

    event: str
    prompt: Optional[str] = None


class _Publisher:
    """One shared session's chunks (and notes) to the hub, in order (module doc)."""

    def __init__(self, hub: DeploymentHandle, key: str, keepalive_s: float, log: KeyValueLog,
                 first: Optional[tuple[str, Callable[[str], object]]] = None) -> None:
        self._hub, self._key, self._keepalive_s, self._log = hub, key, keepalive_s, log
        self._queue: list[WorldChunk | WorldNote] = []
        self._wake = asyncio.Event()
        self.dropped = 0
        self._first = first  # (owner, shown): a resumed session attaches to its world first; `shown(prompt)`:
        # its world shows the prompt (the last one told)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"publish-{key}")

    def put(self, item: WorldChunk | WorldNote) -> None:
        chunks = [i for i in self._queue if isinstance(i, WorldChunk)]
        if isinstance(item, WorldChunk) and len(chunks) >= PUBLISH_BACKLOG:
            self._queue.remove(chunks[0])  # (notes are never dropped: a few words each)
            self.dropped += 1
        self._queue.append(item)
        self._wake.set()

    async def _run(self) -> None:
        if self._first is not None:
            ended, world = await settle(self._hub.back.remote(self._key, self._first[0]), HUB_TIMEOUT_S)
            if not ended or world is None or isinstance(world, BaseException):
                return  # the session was not shared (or the hub is gone): nothing to publish
            ended, prompt = await settle(self._hub.shown_prompt.remote(self._key), HUB_TIMEOUT_S)
            if ended and isinstance(prompt, str):
                self._first[1](prompt)  # a `show_prompt` share: its prompt updates go on being told
        while True:
            try:
                async with asyncio.timeout(self._keepalive_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if not self._queue:
                call = self._hub.heard.remote(self._key)
            else:
                item = self._queue.pop(0)
                call = self._hub.publish.remote(self._key, item) if isinstance(item, WorldChunk) else \
                    self._hub.note.remote(self._key, item.event, item.prompt)
                if self._queue:
                    self._wake.set()
            ended, live = await settle(call, HUB_TIMEOUT_S)
            if ended and live is False:
                return  # the world ended (unshared, swept): nothing more to publish
            if ended and isinstance(live, BaseException):
                self._log.warning("publishing to the world hub failed", fields={"session": self._key,
                                                                                "error": repr(live)})


class Sharing:
    """The worlds one connection owns (module doc). `hub` None: sharing is off (`share` refused)."""

    def __init__(self, hub: Optional[DeploymentHandle], args: AppArgs, principal: str, log: KeyValueLog,
                 error: Callable[..., ErrorReply], on_input: Callable[[], None] = lambda: None,
                 notice: Callable[[BaseModel], None] = lambda reply: None) -> None:
        """`principal`: the owner's (its API key, else its address); `error(code, message,
        session_id, retry_after_s)`: an error reply (replies.py); `on_input`: the players' inputs
        changed (the driver looks again); `notice(reply)`: send a reply now, unasked (the
        `players` of a world whose viewers or roles changed)."""
        self._hub = hub
        self._notice = notice
        self._notify: set[str] = set()  # stream keys whose share has `notify_players` (on this socket)
        self._on_input = on_input
        self._inboxes: dict[str, Inbox] = {}  # stream key -> its world's players' inputs
        self._error = error
        self._args = args
        self._principal = principal
        self._log = log
        self._inits: dict[str, bytes] = {}  # stream key -> init segment (chunk 0 sent on this socket)
        self._last: dict[str, FrameReply] = {}  # stream key -> the last chunk sent: a new world's first
        self._published: dict[str, _Publisher] = {}  # stream key -> its publisher (shared, or resumed)
        self._resumed: set[str] = set()  # stream keys resumed on this socket (their chunk 0 went elsewhere)
        self._shown: dict[str, str] = {}  # stream key -> the prompt its viewers were told (a `show_prompt` share)
        self._paused: set[str] = set()  # stream keys whose drive is paused (their `paused` was sent)
        self._streams: dict[str, Stream] = {}  # stream key -> the stream it publishes (its head for forks)
        self._sources = None if hub is None else ForkSources(hub, log)  # forks of its worlds (fork_source.py)

    def answer(self, req: Request, stream: Optional[Stream]) -> Optional[asyncio.Future[BaseModel]]:
        """The reply to `share`, `unshare` or the owner's players' requests (a future), None for
        any other request."""
        if isinstance(req, ShareRequest):
            return self.share(req, stream)
        if isinstance(req, (GrantRequest, RevokeRequest, KickRequest, PassControlsRequest)):
            return self.players(req, stream)
        if isinstance(req, (AskControlsRequest, PromptRequest)):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{req.endpoint}` is a viewer's, on the watch route; the "
                                                       "owner drives with `control` and steers with `prompt_update`")
        return self.unshare(req, stream) if isinstance(req, UnshareRequest) else None

    def players(self, req: GrantRequest | RevokeRequest | KickRequest | PassControlsRequest,
                stream: Optional[Stream]) -> asyncio.Future[BaseModel]:
        """The owner's `grant` / `revoke` / `kick` / `pass_controls`: the reply is `players`."""
        if self._hub is None:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this server does not share worlds (`sharing.enabled` is off)")
        stream = self._open(req.session_id, stream, req.endpoint)
        action = {"grant": "direct" if getattr(req, "director", False) else "grant", "revoke": "revoke",
                  "kick": "kick", "pass_controls": "pass"}[req.endpoint]
        call = self._hub.owners.remote(stream.key, self._principal, action, req.viewer_id)
        return asyncio.ensure_future(self._players(req, call))

    def inputs_for(self, session_id: str) -> Optional[Inbox]:
        """The players' inputs of the shared session `session_id` (None: not shared here)."""
        return next((i for i in self._inboxes.values() if i.session_id == session_id and not i.task.done()), None)

    def steering(self, stream: Stream, take: bool = True) -> Optional[str]:
        """The director's prompt its next chunk attends to, if one came: taken now, unless
        `take` is False (read only: the chunk may still be refused; inbox.py)."""
        inbox = self._inboxes.get(stream.key)
        return None if inbox is None else inbox.steering(take)

    def share(self, req: ShareRequest, stream: Optional[Stream]) -> asyncio.Future[BaseModel]:
        """The reply to `share` (a future: the hub answers it). ProtocolError at once when the
        request cannot be served here."""
        if self._hub is None:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this server does not share worlds (`sharing.enabled` is off)")
        stream = self._open(req.session_id, stream, "share")
        if stream.spec.raw_frames:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "a session of raw frames (clip mode) cannot be shared: "
                                                       "viewers get the fMP4 stream")
        init = self._inits.get(stream.key)
        need_init = init is None and stream.key in self._resumed
        last = self._last.get(stream.key)
        prompt = None
        if req.show_prompt:  # the prompt of the chunk viewers get first (else the session's now)
            prompt = stream.prompt if last is None else chunk_prompt(stream, last.chunk_id)
            self._shown[stream.key] = prompt
        else:
            self._shown.pop(stream.key, None)
        call = self._hub.share.remote(self._principal, stream.key, req.audience, req.controls, init, need_init,
                                      None if last is None else world_chunk(last), prompt)
        return asyncio.ensure_future(self._shared(req, stream, call))

    def unshare(self, req: UnshareRequest, stream: Optional[Stream]) -> asyncio.Future[BaseModel]:
        if self._hub is None:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this server does not share worlds (`sharing.enabled` is off)")
        stream = self._open(req.session_id, stream, "unshare")
        self._stop(stream.key)
        call = self._hub.end.remote(stream.key, "the owner unshared it", self._principal)
        return asyncio.ensure_future(self._unshared(req, call))

    def sent(self, stream: Stream, reply: FrameReply | Paused) -> None:
        """The send loop sent `reply` (the outbox's `on_sent`): its chunk goes to the stream's
        world, after a `resumed` (the drive paused before it) and a `prompt` (a prompt update
        made it attend to another prompt, shown when the share says so); a driven session's
        `paused` goes as `paused`."""
        publisher = self._published.get(stream.key)
        if isinstance(reply, Paused):
            if stream.key not in self._paused:
                self._paused.add(stream.key)
                if publisher is not None:
                    publisher.put(WorldNote("paused"))
            return
        if stream.key in self._paused:
            self._paused.discard(stream.key)
            if publisher is not None:
                publisher.put(WorldNote("resumed"))
        if publisher is not None and stream.key in self._shown:
            prompt = chunk_prompt(stream, reply.chunk_id)
            if prompt != self._shown[stream.key]:
                self._shown[stream.key] = prompt
                publisher.put(WorldNote("prompt", prompt))
        if reply.chunk_id == 0 and reply.video[4:8] == b"ftyp":
            self._inits[stream.key] = split_init(reply.video)[0]
        self._last[stream.key] = reply  # (the ResumeBook keeps its last replies too: no copy)
        if publisher is not None:
            publisher.put(world_chunk(reply))

    def resumed(self, stream: Stream) -> None:
        """A parked session resumed on this socket: it attaches to its world, if it has one."""
        self._resumed.add(stream.key)
        if self._hub is not None and stream.key not in self._published:
            self._publish(stream, first=(self._principal, lambda prompt: self._shown.setdefault(stream.key, prompt)))
            self._listen(stream)

    def ended(self, stream: Stream) -> None:
        """The session ended here (releases.py `ended`): its world ends."""
        self._last.pop(stream.key, None)
        self._inits.pop(stream.key, None)
        self._shown.pop(stream.key, None)
        self._paused.discard(stream.key)
        if self._stop(stream.key):
            detach(self._tell("end", stream.key, "the owner's session ended"), name=f"world-end-{stream.key}")

    def leave(self, parked: Optional[Stream]) -> None:
        """The socket ended (after its releases): the parked session's world waits for its
        resume; any other still attached ends."""
        for key in list(self._published):
            self._stop(key)
            if parked is not None and key == parked.key:
                grace = self._args.sessions.resume.grace_s + AWAY_MARGIN_S
                detach(self._tell("away", key, grace), name=f"world-away-{key}")
            else:
                detach(self._tell("end", key, "the owner left"), name=f"world-end-{key}")
        self._inits.clear()
        self._last.clear()
        self._resumed.clear()
        self._shown.clear()
        self._paused.clear()

    # ---- internals ----

    def _open(self, session_id: str, stream: Optional[Stream], what: str) -> Stream:
        if stream is None or stream.spec.session_id != session_id or stream.state is not StreamState.OPEN:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{what}` names the open session of this connection; "
                                                       "start it (or switch to it) first")
        return stream

    def _listen(self, stream: Stream) -> None:
        inbox = self._inboxes.get(stream.key)
        if inbox is None or inbox.task.done():
            sid = stream.spec.session_id
            self._inboxes[stream.key] = Inbox(self._hub, stream.key, sid, self._on_input, self._log,
                                              on_roles=lambda inputs: self._roles(stream.key, sid, inputs))

    def _head(self, key: str):
        """The head of stream `key` for a fork of its world (fork_source.py): the chunks sent."""
        stream, last = self._streams.get(key), self._last.get(key)
        if stream is None:
            return SessionLost("this world's session just ended; it cannot be forked")
        if last is None:  # resumed on this socket, nothing sent here yet: the chunks journaled, at most
            return world_head(stream, min(stream.next_chunk, len(stream.journal.chunks)))
        return world_head(stream, last.chunk_id + 1)

    def _publish(self, stream: Stream, first: Optional[tuple[str, Callable[[str], object]]] = None) -> _Publisher:
        """Publish `stream`'s chunks to its world, and answer the forks of its head."""
        publisher = self._published[stream.key] = _Publisher(self._hub, stream.key,
                                                             self._args.sharing.owner_keepalive_s, self._log, first)
        self._streams[stream.key] = stream
        self._sources.start(stream.key, lambda key=stream.key: self._head(key))
        return publisher

    def _stop(self, key: str) -> bool:
        self._notify.discard(key)
        inbox = self._inboxes.pop(key, None)
        if inbox is not None:
            inbox.task.cancel()
            self._on_input()  # the owner's own keys drive again
        self._streams.pop(key, None)
        if self._sources is not None:
            self._sources.stop(key)
        publisher = self._published.pop(key, None)
        if publisher is not None:
            publisher.task.cancel()
        return publisher is not None

    async def _tell(self, method: str, *args: object) -> None:
        ended, result = await settle(getattr(self._hub, method).remote(*args), HUB_TIMEOUT_S)
        if not ended or isinstance(result, BaseException):
            self._log.warning("the world hub did not answer", fields={"call": method, "error": repr(result)})

    async def _shared(self, req: ShareRequest, stream: Stream, call) -> BaseModel:
        ended, result = await settle(call, HUB_TIMEOUT_S)
        if isinstance(result, ReplicaError):
            return self._error(result.code, result.message, req.session_id, getattr(result, "retry_after_s", None))
        if not ended or isinstance(result, BaseException):
            return self._error(ErrorCode.BUSY, "the world hub did not answer; try again", req.session_id, 5.0)
        world_id, token = result
        publisher = self._published.get(stream.key)
        if stream.state is StreamState.OPEN and (publisher is None or publisher.task.done()):
            publisher = self._publish(stream)
            if stream.key in self._paused:  # paused before it was shared
                publisher.put(WorldNote("paused"))
        if stream.state is StreamState.OPEN:
            self._listen(stream)
            (self._notify.add if req.notify_players else self._notify.discard)(stream.key)
            inbox = self._inboxes[stream.key]
            if req.notify_players and inbox.inputs is not None:  # (else its first snapshot is told)
                self._roles(stream.key, req.session_id, inbox.inputs)
        return Shared(session_id=req.session_id, world_id=world_id, watch_url=f"{WATCH_ROUTE}?world={world_id}",
                      watch_token=token, audience=req.audience, controls=req.controls, show_prompt=req.show_prompt)

    def _roles(self, key: str, session_id: str, inputs: PlayerInputs) -> None:
        """The roles of the stream's world changed (inbox.py): told when its share asked."""
        if key in self._notify:
            self._notice(players_of(session_id, inputs, True))

    async def _players(self, req: GrantRequest | RevokeRequest | KickRequest | PassControlsRequest,
                       call) -> BaseModel:
        ended, result = await settle(call, HUB_TIMEOUT_S)
        if isinstance(result, ReplicaError):
            return self._error(result.code, result.message, req.session_id, None)
        if not ended or isinstance(result, BaseException):
            return self._error(ErrorCode.BUSY, "the world hub did not answer; try again", req.session_id, 5.0)
        return players_of(req.session_id, result)

    async def _unshared(self, req: UnshareRequest, call) -> BaseModel:
        ended, result = await settle(call, HUB_TIMEOUT_S)
        world_id = result if ended and isinstance(result, str) else None
        return Unshared(session_id=req.session_id, world_id=world_id)
