"""Reopen: a saved world's inputs run again through the model served now (PROTOCOL.md, reopen).

A world made by another model setup (its fingerprint differs: `world_changed`, naming each
field with its value then and now) cannot continue byte-identical, but what made it is in the
store: the start image, the opening prompt and its options (seed, size, declared length,
translation scale, intrinsics' resolution), and per chunk the camera as received and the
prompt update made before it. `reopen {world_id, session_id}` turns them into the infers of a
new session (`reopen_requests`) and sends them through the connection's own infer path, as if
the client had sent them: `reopened {chunks, changed}`, then one frame reply per chunk (chunk 0
with the session's resume token). The chunks are new: the served model makes them, and where
its setup changed they are not the stored ones' bytes. The world itself is not changed; the new
session keeps a world of its own, as every session does.

The first infer is handled before the next client frame is read (as an `open` is loaded); the
others follow as the connection has room (`sessions.max_pending_chunks` in flight). The feed
stops when the session is no longer the connection's current one or not at the chunk it would
send (the client reset it, sent an infer of its own, opened another; a chunk failed), and when
the socket ends.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from camera import parse_size
from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.ingress.outbox import Outbox
from deployments.ingress.sizes import SizeRule
from deployments.ingress.stream import Stream, StreamState
from deployments.ingress.worlds.requests import world_error
from deployments.ingress.worlds.sessions import SessionWorlds
from deployments.worlds.errors import WorldError
from deployments.worlds.manifest import fingerprint_changes, served_model
from deployments.worlds.worlds import World
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import ErrorReply, InferRequest, Reopened, ReopenRequest
from protocol.requests import SessionStart, infer_request


def num_frames_of(total_latent_frames: Optional[int]) -> Optional[int]:
    """The `num_frames` a first infer declares for a session of that many latent frames."""
    return None if total_latent_frames is None else 4 * (total_latent_frames - 1) + 1


def size_for(resolution: tuple[int, int], image_shape: tuple[int, ...], rule: SizeRule, default_area: int) -> str:
    """The `size` ("H*W") under which this server makes `resolution` from an image of that shape
    (a world keeps its output size, not the `size` asked): the server's default area, else the
    first area from the resolution's own up to a quarter more (the rule rounds each side down)
    that gives it; else the resolution's own, and the served rule decides (its buckets changed)."""
    h, w = resolution
    for area in (default_area, *range(h * w - h * w % 16, h * w * 5 // 4, 16)):  # a few thousand at most
        area -= area % 16  # said as "A/16*16": only the area counts
        try:
            if rule.output(area, image_shape[0], image_shape[1]) == (h, w):
                return f"{area // 16}*16"
        except ProtocolError:
            continue
    return f"{h}*{w}"


def reopen_requests(world: World, session_id: str, limits: Limits, size: str) -> list[InferRequest]:
    """The infers of a new session `session_id` from the world's inputs, one per chunk: the first
    with the image, prompt and options (`size`: see `size_for`), each with its chunk's camera
    and prompt update (ProtocolError where this server's limits refuse one)."""
    m = world.manifest
    start = SessionStart(world.image, m.prompt, seed=m.seed, size=size,
                         num_frames=num_frames_of(m.total_latent_frames), translation_scale=m.translation_scale,
                         intrinsics_resolution=tuple(m.intrinsics_resolution))
    return [infer_request(session_id, c.past.poses, c.past.intrinsics, start=start if k == 0 else None,
                          prompt_update=c.prompt if k else None, limits=limits)
            for k, c in enumerate(world.chunks)]


class Reopening:
    """A connection's `reopen` and the feed of its infers (None `worlds`: no world store)."""

    def __init__(self, worlds: Optional[SessionWorlds], args: AppArgs, limits: Limits,
                 inflight: Callable[[], set[asyncio.Task]], current: Callable[[], Optional[Stream]],
                 dispatch: Callable[[InferRequest, float], Any]) -> None:
        """`inflight`: the connection's chunks not yet answered; `current`: its current stream;
        `dispatch`: handles an infer without an image as a client's (connection.py `_dispatch`)."""
        self._w = worlds
        self._limits = limits
        self._max_pending = args.sessions.max_pending_chunks
        self._sizes = SizeRule(tuple(args.model.bucket_sizes()), args.model.max_output_area)
        self._default_area = parse_size(args.model.default_size)
        self._inflight = inflight
        self._current = current
        self._dispatch = dispatch
        self._feed: Optional[asyncio.Task] = None

    async def handle(self, req: ReopenRequest, outbox: Outbox,
                     first: Callable[[InferRequest], Awaitable[object]]) -> None:
        """Answer `req`; `first` handles the session's first infer (its image decoded) before
        the receive loop reads on."""
        self.stop()
        sid = req.session_id
        if self._w is None:
            outbox.reply_now(ErrorReply(code=ErrorCode.BAD_MESSAGE, session_id=sid, message=(
                "this server keeps no worlds (worlds.enabled is off, or this socket's sessions are not kept)")))
            return
        try:
            world = await asyncio.to_thread(self._w.keeping.worlds.load, self._w.principal, req.world_id)
        except WorldError as e:  # not found (another's), not an id, damaged, the store down
            outbox.reply_now(world_error(e, sid))
            return
        if not world.chunks:
            outbox.reply_now(ErrorReply(code=ErrorCode.BAD_MESSAGE, session_id=sid,
                                        message="this world has no chunk to run again"))
            return
        try:
            m = world.manifest
            size = size_for((m.height, m.width), world.image.shape, self._sizes, self._default_area)
            infers = reopen_requests(world, sid, self._limits, size)
        except ProtocolError as e:  # e.g. a size over this server's max_output_area
            outbox.reply_now(ErrorReply(code=e.code, session_id=sid, message=f"this world's inputs are refused "
                                        f"here: {e.message}"))
            return
        changed = fingerprint_changes(world.manifest.model, served_model(self._w.keeping.args))
        outbox.reply_now(Reopened(session_id=sid, world_id=world.manifest.world_id, chunks=len(infers),
                                  changed=changed))
        await first(infers[0])
        stream = self._current()
        if len(infers) > 1 and self._at(stream, sid, 1):
            self._feed = asyncio.create_task(self._run(stream, infers[1:]))

    @staticmethod
    def _at(stream: Optional[Stream], sid: str, k: int) -> bool:
        return (stream is not None and stream.spec.session_id == sid and stream.state is StreamState.OPEN
                and stream.next_chunk == k)

    async def _run(self, stream: Stream, infers: list[InferRequest]) -> None:
        for k, infer in enumerate(infers, 1):
            while len(self._inflight()) >= self._max_pending:
                await asyncio.wait(set(self._inflight()), return_when=asyncio.FIRST_COMPLETED)
            if self._current() is not stream or not self._at(stream, infer.session_id, k):
                return  # the client took the session elsewhere, or a chunk failed
            try:
                self._dispatch(infer, time.perf_counter())
            except ReplicaError:  # answered by the dispatch itself; nothing more to feed
                return

    def stop(self) -> None:
        """No more infers of a reopen (the socket ends, another reopen starts)."""
        if self._feed is not None:
            self._feed.cancel()
            self._feed = None
