"""Rebuild: a fork's state made on the replicas (branching.py), a copy where one can be made,
else the journal's replay."""
from __future__ import annotations

from typing import Optional

from deployments.config import SessionArgs
from deployments.errors import Busy, TooLarge
from deployments.ingress.lane_jobs import Backends, dit_admission, reserve_dit
from deployments.ingress.stream import Stream, new_routing_key
from deployments.log import KeyValueLog


class Rebuild:
    """Per lane: `clone` on the replica that holds the source, else the journal replayed."""

    def __init__(self, backends: Backends, sessions: SessionArgs, log: KeyValueLog) -> None:
        self._b = backends
        self._sessions = sessions
        self._log = log

    async def vae(self, stream: Stream, source_key: Optional[str], paths: dict[str, str]) -> None:
        """VAE lane: a copy of the source's session on its replica (`source_key` given), else (or
        when that replica cannot) the journal's conditions and decodes replayed."""
        if source_key is not None:
            if await self._cloned(self._b.vae, source_key, stream, "vae", stream.vae_key):
                paths["vae"] = "clone"
                return
            stream.vae_key = new_routing_key(stream.spec.session_id)  # the failed clone's key stays pinned there
        self.replayable(stream)
        paths["vae"] = "replay"
        key, j, (h, w) = stream.vae_key, stream.journal, stream.spec.resolution
        await self._b.vae.options(session_id=key).restore.remote(
            key, j.image, h, w, stream.next_chunk, j.decoded_latents(), stream.spec.raw_frames)

    async def dit(self, stream: Stream, source_key: Optional[str], paths: dict[str, str]) -> None:
        """DiT lane: a copy of the source's session on its replica (`source_key` given: admitted
        there like a new session), else (or when that replica cannot) admitted like a new
        session (its slot and bytes, before any work), the VAE's admission waited for, then its
        chunks replayed."""
        admitted = dit_admission(stream)
        try:
            if source_key is not None:
                if await self._cloned(self._b.dit, source_key, stream, "dit", stream.dit_key, stream.spec):
                    paths["dit"] = "clone"
                    if not admitted.done():
                        admitted.set_result(None)
                    return
                stream.dit_key = new_routing_key(stream.spec.session_id)  # the failed clone's key stays pinned there
            self.replayable(stream)
        except BaseException as e:  # busy, too_large: the fork's admission refused
            if not admitted.done():
                admitted.set_exception(e)
            raise
        paths["dit"] = "replay"
        key, j = stream.dit_key, stream.journal
        dit = self._b.dit.options(session_id=key)
        await reserve_dit(dit, stream)
        await dit.restore.remote(key, stream.spec, j.context, list(j.chunks), j.noise)

    def replayable(self, stream: Stream) -> None:
        """A fork that must replay (a replica could not copy) needs its journal: TooLarge without."""
        if not stream.journal.recoverable:
            raise TooLarge("the session has no journal to rebuild the fork from (" + self.no_journal_why() +
                           ") and its replica could not copy it; fork it again later, or start a new session")

    def no_journal_why(self) -> str:
        if not self._sessions.recovery:
            return "this server keeps no session journals (sessions.recovery is off)"
        return (f"the session's journal outgrew sessions.journal_max_mib ({self._sessions.journal_max_mib:g} MiB) "
                "and was dropped")

    async def _cloned(self, handle, source_key: str, stream: Stream, lane: str, key: str, *options) -> bool:
        """`handle.clone` of the source (routed by its key, to its replica): True once copied;
        `busy` / `too_large` raised (that replica is full: the fork is refused like a new
        session); False for anything else (the replica is gone, lost the source, cannot copy)."""
        try:
            await handle.options(session_id=source_key).clone.remote(source_key, key, *options)
            return True
        except (Busy, TooLarge):
            raise
        except Exception as e:  # noqa: BLE001 - any other failure: the journal replay
            self._log.info("fork cannot clone; replaying the journal", fields={
                "session": stream.key, "lane": lane, "error": f"{type(e).__name__}: {e}"[:200]})
            return False
