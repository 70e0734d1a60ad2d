"""WorldRequests: a connection's `save` and `open` (PROTOCOL.md, saved worlds).

* `save {session_id, title}`: the session this connection holds is copied, as its world has it
  once its chunks whose replies were built before the save are written (other sessions'
  queued chunks are not waited for), into a new world of the caller's with that title (`copy_world`: through
  the `.lwf` format, every part checked); `saved {world_id, chunks}`. The session goes on and
  its own world with it; the saved world no longer changes. Answered in request order (the
  outbox), without holding the receive loop.
* `open {world_id, session_id}`: the caller's world (its principal's only: another's id is
  `world_not_found`, like an unknown one) becomes session `session_id` of this connection in
  place of its current one, like a resumed session: its journal made back from the world
  (`journal_from_world`), a fresh routing key no replica holds, so that its first call on each
  deployment rebuilds it from the journal (history/recovery.py), on whichever replicas have
  room: any replica, any ingress. The receive loop waits for the world to load (as for a
  resume's claim), so that the infers after `open` continue it; `opened {next_chunk_id,
  resume_token}`. A world of another model setup is `world_changed` naming the fields.
  The opened session keeps a world of its own from then on (its chunks and their videos).
  `world_changed` carries the world's id and the changed fields: `reopen` (reopen.py) runs its
  inputs again through the served model.
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import Callable
from typing import Optional

from pydantic import BaseModel

from deployments.errors import ReplicaError
from deployments.ingress.outbox import Outbox
from deployments.ingress.releases import Releases
from deployments.ingress.resume import ResumeBook
from deployments.ingress.stream import Stream, StreamState, image_digest
from deployments.ingress.worlds.changes import world_changed
from deployments.ingress.worlds.sessions import SessionWorlds
from deployments.ingress.worlds.spill import WorldSpill
from deployments.wire import SessionOptions, owner_tag, routing_key
from deployments.worlds.errors import BadWorldFile, QuotaExceeded, StoreUnavailable, WorldError
from deployments.worlds.ids import new_world_id, principal_dir
from deployments.worlds.journal_parts import journal_from_world
from deployments.worlds.lwf import export_world, read_lwf
from deployments.worlds.manifest import Manifest, served_model
from deployments.worlds.worlds import Worlds
from media.reassembly import split_init
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, Opened, OpenRequest, Saved, SaveRequest

SAVE_WAIT_S = 10.0  # a save waits this long at most for the writer to write what was queued
MIB = 1024 * 1024


def copy_world(worlds: Worlds, principal: str, world_id: str, title: str) -> Manifest:
    """The principal's world copied into a new world of its, titled `title` (blocking)."""
    buf = io.BytesIO()
    size = export_world(worlds, principal, world_id, buf)
    manifest, parts = read_lwf(io.BytesIO(buf.getvalue()), size)
    now = worlds.now()
    mine = dataclasses.replace(manifest, world_id=new_world_id(), owner=principal_dir(principal), title=title,
                               created=now, updated=now, bytes=0)
    return worlds.put_world(principal, mine, parts)


def world_error(e: WorldError, session_id: str) -> ErrorReply:
    if isinstance(e, QuotaExceeded):
        code = ErrorCode.WORLD_QUOTA
    elif isinstance(e, StoreUnavailable):
        code = ErrorCode.STORE_UNAVAILABLE
    elif isinstance(e, BadWorldFile):
        return ErrorReply(code=ErrorCode.SESSION_LOST, message=f"the world is damaged in the store: {e.message}",
                          session_id=session_id)
    else:  # not found, not the caller's, not an id
        code = ErrorCode.WORLD_NOT_FOUND
    return ErrorReply(code=code, message=e.message, session_id=session_id)


def _init_of(video: Optional[bytes]) -> Optional[bytes]:
    """The init segment chunk 0's video began with (None: no video kept, or raw frames)."""
    try:
        return None if video is None else split_init(video)[0]
    except ValueError:
        return None


class WorldRequests:
    """`save` and `open` of one connection (None `worlds`: this server keeps no worlds)."""

    def __init__(self, worlds: Optional[SessionWorlds], releases: Releases, resume: ResumeBook,
                 stop_driving: Callable[[], None]) -> None:
        self._w = worlds
        self._releases = releases
        self._resume = resume
        self._stop_driving = stop_driving

    async def handle(self, req: SaveRequest | OpenRequest, cur: Optional[Stream], outbox: Outbox) -> Optional[Stream]:
        """Answer `req` through `outbox`; the connection's current stream after it."""
        if self._w is None:
            outbox.reply_now(ErrorReply(code=ErrorCode.BAD_MESSAGE, message="this server keeps no worlds "
                                        "(worlds.enabled is off, or this socket's sessions are not kept)",
                                        session_id=req.session_id))
            return cur
        if isinstance(req, SaveRequest):
            outbox.put(asyncio.ensure_future(self._save(req, cur)))
            return cur
        try:
            stream, reply = await self._open(req, cur)
        except ReplicaError as e:  # the key's session quota (busy)
            outbox.reply_now(ErrorReply(code=e.code, message=e.message, session_id=req.session_id,
                                        retry_after_s=getattr(e, "retry_after_s", None)))
            return cur
        outbox.reply_now(reply)
        return stream if stream is not None else cur

    async def _save(self, req: SaveRequest, cur: Optional[Stream]) -> BaseModel:
        w = self._w
        source = None if cur is None or cur.spec.session_id != req.session_id else w.world_of(cur)
        if source is None or cur.state is not StreamState.OPEN:
            return ErrorReply(code=ErrorCode.BAD_MESSAGE, session_id=req.session_id, message=(
                "`save` names the session this connection holds, once one of its chunks was answered"))
        if not await w.written(cur, SAVE_WAIT_S):
            return ErrorReply(code=ErrorCode.STORE_UNAVAILABLE, session_id=req.session_id, message=(
                "the world store does not keep up: the session's chunks are not all written yet; save again later"))
        try:
            m = await asyncio.to_thread(copy_world, w.keeping.worlds, w.principal, source, req.title)
        except WorldError as e:
            return world_error(e, req.session_id)
        return Saved(session_id=req.session_id, world_id=m.world_id, chunks=m.chunks)

    async def _open(self, req: OpenRequest, cur: Optional[Stream]) -> tuple[Optional[Stream], BaseModel]:
        w, sid = self._w, req.session_id
        keeping = w.keeping
        try:
            world = await asyncio.to_thread(keeping.worlds.load, w.principal, req.world_id)
        except WorldError as e:  # not found (another's), not an id, damaged, the store down
            return None, world_error(e, sid)
        m, args = world.manifest, keeping.args
        changed = world_changed(m.world_id, m.model, served_model(args), "this world")
        if changed is not None:  # field by field, and the `reopen` that runs it again (reopen.py)
            return None, ErrorReply(code=ErrorCode.WORLD_CHANGED, session_id=sid, message=changed.message,
                                    world_id=changed.world_id, changed=list(changed.changed))
        journal = journal_from_world(world, int(args.sessions.journal_max_mib * MIB) if args.sessions.recovery
                                     else None, WorldSpill(keeping.worlds, w.principal, req.world_id))  # over budget
        if not world.chunks or world.context is None or not journal.recoverable:
            return None, ErrorReply(code=ErrorCode.TOO_LARGE, session_id=sid, message=(
                "this world cannot be opened here: it has no chunk, or it is larger than sessions.journal_max_mib "
                "(or sessions.recovery is off)"))
        n = len(world.chunks)
        spec = SessionOptions(session_id=sid, prompt=m.prompt, image_digest=image_digest(world.image),
                              resolution=(m.height, m.width), seed=m.seed, total_latent_frames=m.total_latent_frames,
                              translation_scale=m.translation_scale, intrinsics_resolution=m.intrinsics_resolution,
                              owner=owner_tag(w.principal))
        key = routing_key(sid, spec.owner)  # no replica holds it: its first calls rebuild it (recovery.py)
        stream = Stream.resumed(spec, journal, world.image, (key, key, key), n, journal.prompt_after(n, m.prompt))
        self._releases.adopt(stream, replacing=cur)  # the key's session quota: busy, nothing changed
        self._stop_driving()  # a driven session it replaced
        token = self._resume.opened(stream)
        w.opened(stream, [c.video for c in world.chunks])
        return stream, Opened(session_id=sid, world_id=m.world_id, next_chunk_id=n, resume_token=token,
                              init_segment=_init_of(world.chunks[0].video))
