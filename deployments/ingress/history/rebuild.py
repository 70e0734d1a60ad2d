"""Rebuild: a session's state made anew on the replicas after k chunks, a copy where one can be
made, else the journal's replay. For a fork (branching.py) of a live session at its head, the
source is that session (`clone` routed by its key); for a fork below the head, a rewind, and a
session leaving the prefix store (prefix/reuse.py) it is a snapshot the replicas may keep
(`<key>#<k>`, deployments/replicas/snapshots.py: `clone` routed by the snapshot id). Per lane, a
copy refused `busy` / `too_large` is refused (the replica is full); any other failure (no such
snapshot, the replica left, an engine that cannot copy) replays the journal under a fresh key.
The path each lane took (`clone`, `snapshot`, `replay`) is written into `paths`. A session that
yielded its seat (line/seat.py) waits its turn in line first (its DiT admission), and its VAE
replay waits for that admission."""
from __future__ import annotations

from typing import Optional

from deployments.errors import Busy, TooLarge
from deployments.ingress.lanes import ReplicaLanes
from deployments.ingress.lane_jobs import dit_admitted, reserve_dit
from deployments.ingress.stream import Stream
from deployments.replicas.snapshots import parse_snapshot_id


class Rebuild:
    """Per lane: `clone` on the replica that holds the source, else the journal replayed."""

    def __init__(self, replicas: ReplicaLanes) -> None:
        self._b = replicas.backends
        self._sessions = replicas.args.sessions
        self._log = replicas.log
        self._line = replicas.line  # the connection's LineSeats: a yielded session's turn (None: none)
        self.snapshots = replicas.args.prefix_cache.snapshot_mib > 0  # the replicas keep snapshots

    def sources(self, stream: Stream, k: int) -> tuple[Optional[str], Optional[str]]:
        """(DiT, VAE) snapshot ids of the session after k chunks, where the replicas keep
        snapshots (None, None: replay the journal; after 0 chunks there is nothing to replay)."""
        if not self.snapshots or k < 1:
            return None, None
        return stream.snapshot_ids(k)

    def inherit(self, stream: Stream, source: Stream, k: int) -> None:
        """`stream`'s first k chunks are `source`'s (a fork, a rewind's new keys): so are their
        snapshots, where the replicas keep any."""
        if self.snapshots:
            stream.inherit_snapshots(source, k)

    async def vae(self, stream: Stream, source_key: Optional[str], paths: dict[str, str], chunks: int) -> None:
        """VAE lane: a copy of the source's session on its replica (`source_key` given), else (or
        when that replica cannot) the journal's conditions and decodes of its first `chunks`
        chunks replayed (the count the caller had when it queued this: an infer queued behind
        it takes its chunk id before this runs)."""
        if source_key is not None:
            if await self._cloned(self._b.vae, source_key, stream, "vae", stream.vae_key, stream.spec):
                paths["vae"] = _copy_path(source_key)
                return
            stream.new_key("vae")  # the failed clone's key stays pinned there
        self.replayable(stream)
        paths["vae"] = "replay"
        if self._line is not None and self._line.queues(stream):  # yielded: nothing held before its turn
            await dit_admitted(stream)
        key, j = stream.vae_key, stream.journal
        decoded = await j.full_decoded_latents()  # spilled chunks read back from the store
        await self._b.vae.options(session_id=key).restore.remote(key, stream.spec, j.image, chunks, decoded)

    async def dit(self, stream: Stream, source_key: Optional[str], paths: dict[str, str]) -> None:
        """DiT lane: a copy of the source's session on its replica (`source_key` given: admitted
        there like a new session), else (or when that replica cannot) admitted like a new
        session (its slot and bytes, before any work), the VAE's admission waited for, then its
        chunks replayed."""
        admitted = stream.dit_admission()
        try:
            if source_key is not None:
                if await self._cloned(self._b.dit, source_key, stream, "dit", stream.dit_key, stream.spec):
                    paths["dit"] = _copy_path(source_key)
                    if not admitted.done():
                        admitted.set_result(None)
                    return
                stream.new_key("dit")  # the failed clone's key stays pinned there
            self.replayable(stream)
        except BaseException as e:  # busy, too_large: the fork's admission refused
            if not admitted.done():
                admitted.set_exception(e)
            raise
        paths["dit"] = "replay"
        await reserve_dit(self._b.dit, stream, self._line)
        key, j = stream.dit_key, stream.journal
        past = await j.full_chunks()  # spilled chunks read back from the store
        await self._b.dit.options(session_id=key).restore.remote(key, stream.spec, j.context, past, j.noise)

    def replayable(self, stream: Stream) -> None:
        """A session that must replay (a replica could not copy) needs its journal: TooLarge without."""
        if not stream.journal.recoverable:
            raise TooLarge("the session has no journal to rebuild it from (" + self.no_journal_why() +
                           ") and its replica could not copy it; fork it again later, or start a new session")

    def no_journal_why(self) -> str:
        if not self._sessions.recovery:
            return "this server keeps no session journals (sessions.recovery is off)"
        return (f"the session's journal outgrew sessions.journal_max_mib ({self._sessions.journal_max_mib:g} MiB) "
                "and was dropped")

    async def _cloned(self, handle, source_key: str, stream: Stream, lane: str, key: str, *options) -> bool:
        """`handle.clone` of the source (routed by its key, to its replica): True once copied;
        `busy` / `too_large` of a live source raised (that replica is full: the fork is refused
        like a new session); False for anything else (the replica is gone, lost the source,
        keeps no such snapshot, cannot copy; a snapshot's replica is full)."""
        try:
            await handle.options(session_id=source_key).clone.remote(source_key, key, *options)
            return True
        except (Busy, TooLarge):
            if parse_snapshot_id(source_key) is None:
                raise
            return False  # a snapshot's replica is full: the replay is placed where there is room
        except Exception as e:  # noqa: BLE001 - any other failure: the journal replay
            self._log.info("cannot copy; replaying the journal", fields={
                "session": stream.key, "lane": lane, "error": f"{type(e).__name__}: {e}"[:200]})
            return False


def _copy_path(source_key: str) -> str:
    return "snapshot" if parse_snapshot_id(source_key) is not None else "clone"
