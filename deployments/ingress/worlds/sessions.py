"""SessionWorlds: one connection's sessions' worlds (keeping.py says what is kept and when).

Per stream (weakly: a record ends with its stream) the world it writes and how many of its
chunks went to the replica's writer. `kept` is called when a chunk's reply is built
(replies.py), `resumed` when a parked or stored session becomes the connection's (resume.py),
`revive` when the parking does not know a resume token (revive.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from deployments.ingress.parking import ParkedSession
from deployments.ingress.stream import Stream
from deployments.ingress.worlds.keeping import Opening, WorldKeeping, world_of_token
from deployments.ingress.worlds.revive import revive
from deployments.ingress.worlds.spill import WorldSpill
from deployments.worlds.chunks import ChunkRecord
from deployments.errors import SessionLost
from deployments.worlds.errors import WriterFull
from deployments.worlds.ids import new_world_id
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

log = logging.getLogger(__name__)
RETRY_S = 0.5  # a session whose chunks the full queue refused tries again this often
RETRY_FOR_S = 600.0  # ... for this long at most


@dataclass(slots=True, weakref_slot=True)
class _Kept:
    world_id: str
    next: int = 0  # chunks of the stream handed to the writer (0 .. next-1)
    upto: int = -1  # the last chunk whose reply was built: to hand over
    videos: dict[int, bytes] = field(default_factory=dict)  # chunks not handed yet: their video
    retry: Optional[asyncio.Task] = None  # hands the rest over once the writer's queue has room
    stream: Optional[weakref.ref] = None  # the stream whose chunks these are (its journal spills to the world)
    spill: Optional[WorldSpill] = None  # this world, where the journal's chunks over its budget are read back
    filling: Optional[asyncio.Task] = None  # reads spilled chunks back to hand them to a new world


class SessionWorlds:
    """One connection's sessions' worlds (see the module doc)."""

    def __init__(self, keeping: WorldKeeping, principal: str, notice: Callable[[ErrorReply], None],
                 digest_of: Callable[[Stream], Optional[str]]) -> None:
        """`principal`: whose worlds (the connection's principal scope); `notice`: sends a notice
        now; `digest_of`: a stream's resume token digest (None: it has none)."""
        keeping.writer.start()  # in the event loop (idempotent)
        self._k = self.keeping = keeping
        self._principal = self.principal = principal
        self._notice = notice
        self._digest_of = digest_of
        self._kept: weakref.WeakKeyDictionary[Stream, _Kept] = weakref.WeakKeyDictionary()
        self._opened: weakref.WeakKeyDictionary[Stream, dict[int, bytes]] = weakref.WeakKeyDictionary()
        self._told = False  # a store_behind notice was sent during this outage

    def world_of(self, stream: Stream) -> Optional[str]:
        rec = self._kept.get(stream)
        return None if rec is None else rec.world_id

    async def written(self, stream: Stream, timeout_s: float) -> bool:
        """Until every chunk of `stream` whose reply was built is in the store (True), or
        `timeout_s` passed (False); other sessions' chunks queued meanwhile are not waited for."""
        rec, deadline = self._kept.get(stream), time.monotonic() + timeout_s
        while rec is not None and (rec.next <= rec.upto or self._k.writer.pending(rec.world_id)):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def revive(self, session_id: str, token: str) -> Optional[ParkedSession]:
        """The session `token` resumes, from the store (revive.py); None: not there."""
        return await revive(self._k, self._principal, session_id, token)

    def resumed(self, stream: Stream) -> None:
        """`stream` was resumed (parked, or from the store): its world has its chunks so far,
        but for those its old connection on this replica still holds for a full writer queue:
        this record takes them over (from the journal the session carries), and the old one
        stops, so that one record hands the world's chunks over, in order."""
        digest = self._digest_of(stream)
        if digest is None:
            return
        rec = self._kept[stream] = _Kept(world_of_token(digest), stream.next_chunk)
        old = self._k.handing.get(rec.world_id)
        if old is not None and old.next < stream.next_chunk:
            if old.retry is not None:
                old.retry.cancel()
            rec.next, rec.upto = old.next, stream.next_chunk - 1
            rec.videos = {i: v for i, v in old.videos.items() if i >= old.next}
            old.next, old.upto = 1 << 30, -1  # hands nothing more
        self._k.handing[rec.world_id] = rec
        self._spills_to(stream, rec)
        if rec.next <= rec.upto:
            self._later(stream, rec)

    def opened(self, stream: Stream, videos: list[Optional[bytes]]) -> None:
        """`stream` was opened from a saved world (requests.py): a world of its own, written from
        its first chunk (the world's videos with them) when its next chunk is kept."""
        self._opened[stream] = {k: v for k, v in enumerate(videos) if v is not None}

    def _new(self, stream: Stream) -> _Kept:
        digest = self._digest_of(stream)
        rec = _Kept(world_of_token(digest) if digest else new_world_id())
        self._k.handing[rec.world_id] = rec
        session = {"session_id": stream.spec.session_id, "image_digest": stream.spec.image_digest,
                   "clip": stream.spec.raw_frames}
        self._k.expect(rec.world_id, Opening(stream.spec, stream.image, stream.journal.context, session))
        self._spills_to(stream, rec)
        return rec

    def _spills_to(self, stream: Stream, rec: _Kept) -> None:
        """The stream's journal may let go of the chunks this world confirms (journal_spill.py)."""
        rec.stream, rec.spill = weakref.ref(stream), WorldSpill(self._k.worlds, self._principal, rec.world_id)
        stream.journal.spill_to(rec.spill)

    def kept(self, stream: Stream, k: int, video: Optional[bytes]) -> None:
        """Chunk k's reply is built: hand the stream's chunks up to k to the writer."""
        j = stream.journal
        if not j.recoverable or len(j.chunks) <= k:  # nothing to write (no world is made for it either)
            return
        rec = self._kept.get(stream)
        if rec is None:
            rec = self._kept[stream] = self._new(stream)
            rec.videos.update(self._opened.pop(stream, {}))
        if rec.world_id in self._k.dropped:
            return
        rec.next, rec.upto = min(rec.next, k), k  # a rewound session's new branch starts at k
        if isinstance(video, (bytes, bytearray)):
            rec.videos[k] = bytes(video)  # held until handed over, like the journal's chunk
        rec.videos = {i: v for i, v in rec.videos.items() if i <= k}  # not a taken-back branch's
        if not self._hand(stream, rec):
            self._tell(f"{self._k.writer.queued} chunks wait for the world store; this session's chunks are kept "
                       "in memory and written when it catches up", stream)
            self._later(stream, rec)
            return
        if self._k.degraded:
            self._tell("the world store does not answer (or is slow): this session's chunks wait in memory "
                       "and are written when it is back; the stream goes on", stream)
        else:
            self._told = False

    def _hand(self, stream: Stream, rec: _Kept, chunks: Optional[list] = None) -> bool:
        """Hand chunks `rec.next` .. `rec.upto` to the writer; False when its queue was full.
        `chunks`: the journal's with spilled ones read back (a fork's or an opened session's new
        world starts with chunks another world holds: read back first, `_filled`)."""
        j = stream.journal
        chunks = j.chunks if chunks is None else chunks
        try:
            while rec.next <= rec.upto and j.recoverable and rec.next < len(chunks):
                i = rec.next
                if chunks[i].latents is None:  # spilled: read back, then handed over (True: no notice)
                    if rec.filling is None or rec.filling.done():
                        rec.filling = asyncio.get_running_loop().create_task(self._filled(stream, rec))
                    return True
                record = ChunkRecord(i, chunks[i], j.noises[i], j.steering.get(i), rec.videos.get(i))
                self._k.writer.submit(self._principal, rec.world_id, record, j.chunks[i - 1].y if i else None)
                rec.videos.pop(i, None)
                rec.next += 1
        except WriterFull:
            return False
        return True

    async def _filled(self, stream: Stream, rec: _Kept) -> None:
        try:
            chunks = await stream.journal.full_chunks()
        except SessionLost as e:
            log.warning("world store: a session's spilled chunks could not be read back for its new world: %s", e)
            return
        if not self._hand(stream, rec, chunks):
            self._later(stream, rec)

    def _later(self, stream: Stream, rec: _Kept) -> None:
        """Hand the rest over once the queue has room, whether the stream goes on or not."""
        if rec.retry is None or rec.retry.done():
            rec.retry = asyncio.get_running_loop().create_task(self._retry(stream, rec))

    async def _retry(self, stream: Stream, rec: _Kept) -> None:
        """Hand the rest over as the queue makes room (`RETRY_S`), for at most `RETRY_FOR_S` (it
        holds the stream, and so its journal, meanwhile)."""
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            await asyncio.sleep(RETRY_S)
            if rec.world_id in self._k.dropped or self._hand(stream, rec):
                return
        log.warning("world store: chunks %d.. of a session were not written (the writer stayed full)", rec.next)

    def _tell(self, message: str, stream: Stream) -> None:
        if not self._told:
            self._told = True
            self._notice(ErrorReply(code=ErrorCode.STORE_BEHIND, message=message, session_id=stream.spec.session_id))
