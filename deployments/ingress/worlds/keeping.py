"""WorldKeeping: each WebSocket session's world, written behind the stream into the world store.

One `WorldKeeping` per ingress replica holds the store's `Worlds` and one `WorldWriter`
(deployments/worlds/writer.py: a bounded queue, one task, the store's calls in a worker
thread), so nothing here runs on the DiT's path or waits for the store. One `SessionWorlds`
(sessions.py) per WebSocket connection keeps, per stream, which world it writes and how many of its chunks were
handed to the writer; `kept(stream, k, video)` is called when chunk k's reply is built
(replies.py): the chunk's record comes from the session's journal (deployments/worlds/
journal_parts.py has the same mapping), its video is the fMP4 bytes the client gets.

- A session's world is under its principal (the API key, else the client address: the
  connection's `principal` scope) and created by the writer before its first chunk (`_Sink`),
  with the opening prompt's encoding and `session.json`: the session id, the image's digest
  and whether it is a clip session, what a resume of it on a new app needs (revive.py).
- A session with a resume token writes the world `world_of_token(digest)`: the token maps to
  its world and nothing else needs storing (the id is a digest of the token's digest, so it
  reveals nothing of the token). A resumed session (`resumed`) writes on in the same world.
- Chunks go to the writer in order; those the writer's full queue refused (`WriterFull`) stay
  with the session (from its journal, their videos held) and are handed over as the queue makes
  room (every 0.5 s, for 10 minutes at most: sessions.py), whether more chunks come or not. A rewound session's next
  chunk rewrites the world from that chunk (`Worlds.put_chunk` drops the old branch).
- A store that fails or lags (`WorldWriter.health()` degraded): the stream goes on, `/healthz`
  says `degraded`, and the connection sends one `store_behind` notice per outage.
- With `worlds.retention_days`, a timer sweeps the store for worlds past it (retention.py).
- A session's journal over `sessions.journal_max_mib` lets go of the chunks its world has
  (written: `_written`) and reads them back to rebuild (spill.py, deployments/worlds/journal_spill.py).
- A session whose journal is not recoverable (recovery off, over its budget) is not kept from
  then on (the journal holds no chunks to write); nor is a `/v1/videos` job's session, nor a
  fork's branch's before its first computed chunk (it gets a world of its own, from then on).
"""
from __future__ import annotations

import hashlib
import json
import logging
import weakref
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from deployments.config import AppArgs
from deployments.ingress.worlds.retention import RetentionSweeper
from deployments.ingress.worlds.spill import use_worlds
from deployments.wire import SessionOptions
from deployments.worlds.chunks import ChunkRecord, encode_array
from deployments.worlds.errors import WorldError, WorldNotFound
from deployments.worlds.ids import principal_dir, world_dir
from deployments.worlds.manifest import Manifest
from deployments.worlds.worlds import CONTEXT, IMAGE, World, Worlds, new_manifest
from deployments.worlds.writer import ChunkJob, WorldWriter

log = logging.getLogger(__name__)
SESSION = "session.json"  # beside the manifest: what a resume on a new app needs besides the world


def world_of_token(digest: str) -> str:
    """The world id of the session whose resume token has this digest (parking.token_digest)."""
    return "w" + hashlib.sha256(f"world-of:{digest}".encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Opening:
    """What creates a session's world (the writer does it, before its first chunk)."""

    spec: SessionOptions
    image: np.ndarray
    context: Optional[np.ndarray]  # the opening prompt's encoding
    session: dict  # session.json


class _Sink:
    """The writer's `Worlds`: a world still to be created is created before its first chunk
    (in the writer's thread, retried like a chunk while the store fails)."""

    def __init__(self, worlds: Worlds, args: AppArgs) -> None:
        self.worlds = worlds
        self._args = args
        self.pending: dict[str, Opening] = {}  # world id -> its opening

    def put_chunk(self, principal: str, world_id: str, record: ChunkRecord,
                  previous_y: Optional[np.ndarray]) -> Manifest:
        opening = self.pending.get(world_id)
        if opening is not None:
            self._create(principal, world_id, opening)
            self.pending.pop(world_id, None)
        return self.worlds.put_chunk(principal, world_id, record, previous_y)

    def _create(self, principal: str, world_id: str, o: Opening) -> None:
        manifest = replace(new_manifest(principal_dir(principal), o.spec.session_id, self._args, o.spec,
                                        self.worlds.now()), world_id=world_id)
        parts = {IMAGE: encode_array(o.image)}
        if o.context is not None:
            parts[CONTEXT] = encode_array(o.context)
        self.worlds.put_world(principal, manifest, parts)
        self.worlds.store.put(f"{world_dir(principal, world_id)}/{SESSION}", json.dumps(o.session).encode())


class WorldKeeping:
    """The ingress replica's world store and its writer."""

    def __init__(self, args: AppArgs, worlds: Worlds) -> None:
        self.args = args
        self.worlds = worlds
        self._sink = _Sink(worlds, args)
        self.writer = WorldWriter(self._sink, max_queue=args.worlds.writer_queue,  # type: ignore[arg-type]
                                  on_refused=self._refused, on_written=self._written)
        self.dropped: set[str] = set()  # worlds the store refused for good (quota, deleted): not written on
        # world id -> the record (sessions.py) that hands its chunks to the writer, while it lives
        self.handing: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.sweeper: Optional[RetentionSweeper] = None  # the retention timer (open_keeping starts it)
        use_worlds(worlds)  # a parked journal's spill, claimed here, reads through this store (spill.py)

    def health(self) -> dict:
        """The writer's state for /healthz, with the recent chunks' seconds from their reply to the
        store (p50, max: the issue's "in the store within 2 s", measured)."""
        recent = sorted(self.writer.write_s)
        p50 = recent[len(recent) // 2] if recent else None
        return {"backend": self.worlds.store.name, **self.writer.health(),
                "write_s_p50": None if p50 is None else round(p50, 3),
                "write_s_max": round(recent[-1], 3) if recent else None}

    @property
    def degraded(self) -> bool:
        return bool(self.writer.health()["degraded"])

    def expect(self, world_id: str, opening: Opening) -> None:
        self._sink.pending[world_id] = opening

    def _written(self, job: ChunkJob) -> None:
        """A chunk is in the store: its session's journal may let it go over its budget
        (deployments/worlds/journal_spill.py)."""
        rec = self.handing.get(job.world_id)
        stream = None if rec is None or rec.stream is None else rec.stream()
        if stream is not None:
            stream.journal.in_store(job.record.index, job.record.past, rec.spill)

    def _refused(self, job: ChunkJob, error: WorldError) -> None:
        log.warning("world store refused chunk %d of a world (%s): the world is not written on", job.record.index,
                    error.code)
        self.dropped.add(job.world_id)
        self._sink.pending.pop(job.world_id, None)

    def load_session(self, principal: str, world_id: str) -> tuple[dict, World]:
        """(session.json, the loaded world): blocking (a worker thread's call)."""
        raw = self.worlds.store.get(f"{world_dir(principal, world_id)}/{SESSION}")
        try:
            session = json.loads(raw)
        except ValueError:
            raise WorldNotFound("the session record is not one") from None
        return session, self.worlds.load(principal, world_id)


def open_keeping(args: AppArgs, log, sweeps: bool = False) -> Optional[WorldKeeping]:
    """The ingress replica's world store from `worlds` (None when `worlds.enabled` is off); its
    place is logged (a local folder: its absolute path). `sweeps` (in a replica's event loop):
    with a `retention_days`, the retention timer starts (retention.py)."""
    if not args.worlds.enabled:
        return None
    from deployments.worlds.backends import describe, open_worlds

    keeping = WorldKeeping(args, open_worlds(args.worlds))
    log.info("worlds kept in the world store", fields={"where": describe(args.worlds)})
    if sweeps and keeping.worlds.retention_s is not None:
        keeping.sweeper = RetentionSweeper(keeping.worlds, args.worlds.sweep_period_s, log)
        keeping.sweeper.start()
    return keeping
