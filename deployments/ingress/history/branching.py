"""Fork and rewind (PROTOCOL.md §2): a session branched or taken back to an earlier chunk.

A fork at the source's head (`at_chunk` == its chunk count: nothing to take back, the common
"branch from here") is a copy of live state: each lane calls `clone(source_key, new_key, ...)`
routed by the source's key, so it reaches the replica that holds the source, which admits the
new session like an open and copies the source's state on the device (`DiTDeployment.clone`,
`VaeDeployment.clone`); the router pins the new key to that replica (deployments/router.py).
Both lanes copy (the VAE's fMP4 muxer encodes each chunk with a fresh encoder, so its state is
counters: media/fmp4.py). A clone refused `busy` / `too_large` refuses the fork (the source's
replica is full); any other failure (the replica left, it lost the source, its engine cannot
clone: the sequence-parallel DiT) falls back, per lane, to the journal rebuild below under a
fresh routing key.

Below the head, and for a rewind, the session after k chunks is copied from the replicas'
snapshot of it where they keep one (`prefix_cache.snapshot_mib`, deployments/replicas/
snapshots.py: `clone` from `<key>#<k>`, one device copy), else (none kept, evicted, its replica
full or gone) it is a journal rebuild (journal.py, recovery.py): the journal's first k chunks
replayed (`DiTDeployment.restore`: one cache-update call per chunk, rolling window included,
then the noise generator put where it was; `VaeDeployment.restore`: k conditions and k decodes,
muxed again). Either way its next chunk is byte-identical to the one an uninterrupted session
with the same first k chunks produces. rebuild.py makes it per lane; the "session forked" /
"session rewound" log lines say which path each lane took (`path`: the DiT's, `vae_path`).

* Rewind: the session keeps its identity on the connection (quota, resume token) but gets
  fresh routing keys; its old incarnation is closed on both lanes first (its snapshots stay;
  `Releases.retire`: the socket's end closes it if that close is still queued), then it is made
  again from its snapshot after k chunks, or its journal truncated to k chunks.
* Fork: a new stream with its own keys from a prefix copy of the journal (arrays shared),
  admitted like a new session (quota at once; a clone's admission, or the DiT's `reserve`, then
  the VAE's and the DiT's `restore`: `busy` / `too_large` when they refuse, the new session then
  released). Its snapshots of the first k chunks are its source's (`SessionJournal.snapshots`).
  The connection then holds it beside its current session (`Branches`); an infer or reset that
  names it makes it the current one. At most `sessions.max_branches` such held sessions.

Either is refused, with nothing changed, for a session the connection does not hold open, a
chunk out of range, a session with a chunk in flight (`busy`: the journal is only complete
between chunks) or being rebuilt by its own fork or rewind (`busy`: one rebuild at a time,
see `_check`), and a session without a journal (recovery off, or over `journal_max_mib`),
except for a fork at its head: that copy needs no journal (if a replica then cannot copy, the
fork is refused `too_large`, as there is nothing to replay). Their replies (`forked`,
`rewound`) come once the rebuild is done, in request order.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Optional, Protocol

from pydantic import BaseModel

from deployments.errors import Busy, ReplicaError
from deployments.ingress.lanes import ReplicaLanes
from deployments.ingress.history.rebuild import Rebuild
from deployments.ingress.releases import Releases
from deployments.ingress.replies import Replies
from deployments.ingress.stream import Stream, StreamState
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import ForkRequest, Forked, Rewound, RewindRequest

IN_FLIGHT_RETRY_S = 0.5  # retry hint of a fork / rewind of a session with a chunk in flight
PLACE_RETRY_S = 0.25  # a rewind's rebuild retries a full replica this often, up to recovery_timeout_s


class Follower(Protocol):
    """A part that keeps its own record per session (resume.py, prefix/reuse.py): told when a
    fork or a rewind makes a session from another's first k chunks, so that its record follows."""

    def forked(self, new: Stream, source: Stream, k: int) -> None: ...

    def rewound(self, stream: Stream, k: int) -> None: ...


class Branches:
    """One connection's forks and rewinds, and the forked sessions it holds besides its current one."""

    def __init__(self, replicas: ReplicaLanes, releases: Releases, replies: Replies,
                 followers: tuple[Follower, ...] = ()) -> None:
        self._dit_lane = replicas.dit_lane
        self._vae_lane = replicas.vae_lane
        self._releases = releases
        self._replies = replies
        self._sessions = replicas.args.sessions
        self._log = replicas.log
        self._held: dict[str, Stream] = {}  # session_id -> an open session that is not the current one
        self._rebuild = Rebuild(replicas)
        self._followers = followers

    def switch(self, session_id: str, current: Optional[Stream]) -> Optional[Stream]:
        """The connection's current stream for a request that names `session_id`: a held one of
        that id becomes current, and the current one (when open) is held in its place."""
        held = self._held.pop(session_id, None)
        if held is None:
            return current
        if current is not None and current.state is StreamState.OPEN:
            self._held[current.spec.session_id] = current
        return held

    # ---- fork ----

    def fork(self, req: ForkRequest, current: Optional[Stream]) -> asyncio.Future:
        """Validate and start a fork (ProtocolError / Busy: nothing changed); the future of its reply."""
        source = self._open(req.session_id, current)
        k = req.at_chunk
        # At the head (nothing to take back) the replicas that hold the source copy its live state;
        # a source only the prefix store served so far is held by none (`materialised`). Such a
        # fork needs no journal, unless a replica then cannot copy (`_replayable`).
        head = k == source.next_chunk and source.materialised
        self._check(source, k, low=1, need_journal=not head)
        new = req.new_session_id
        self._held = {sid: s for sid, s in self._held.items() if s.state is StreamState.OPEN}
        if new == req.session_id or new in self._held or (
                current is not None and current.state is StreamState.OPEN and current.spec.session_id == new):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "`new_session_id` names a session this connection holds; "
                                                       "pick another id (or reset that session first)")
        if len(self._held) >= self._sessions.max_branches:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"this connection holds {len(self._held)} sessions besides "
                                                     "its current one, the most it may (sessions.max_branches); "
                                                     "reset one before forking again")
        journal = source.journal.prefix(k)
        stream = Stream(dataclasses.replace(source.spec, session_id=new), journal, source.image, next_chunk=k,
                        prompt=source.prompt if head else journal.prompt_after(k, source.spec.prompt))
        self._releases.adopt(stream, replacing=None)  # the key's session quota: Busy, nothing changed
        for follower in self._followers:  # its prefix cursor (it writes its chunks), what its client has
            follower.forked(stream, source, k)
        self._held[new] = stream
        paths: dict[str, str] = {}
        dit_source, vae_source = (source.dit_key, source.vae_key) if head else self._rebuild.sources(source, k)
        self._rebuild.inherit(stream, source, k)
        stream.opening(vae=self._vae_lane.submit(lambda: self._rebuild.vae(stream, vae_source, paths, k)),
                       dit=self._dit_lane.submit(lambda: self._rebuild.dit(stream, dit_source, paths)))
        return asyncio.ensure_future(self._forked(stream, source, paths))

    async def _forked(self, stream: Stream, source: Stream, paths: dict[str, str]) -> BaseModel:
        failed = await self._rebuilt(stream)
        if failed is not None:
            if self._held.get(stream.spec.session_id) is stream:
                del self._held[stream.spec.session_id]
            return failed
        self._log.info("session forked", fields={"session": stream.key, "from": source.key, "chunks": stream.next_chunk,
                                                 "path": paths.get("dit"), "vae_path": paths.get("vae")})
        return Forked(session_id=stream.spec.session_id, parent_session_id=source.spec.session_id,
                      next_chunk_id=stream.next_chunk)

    # ---- rewind ----

    def rewind(self, req: RewindRequest, current: Optional[Stream]) -> asyncio.Future:
        """Validate and start a rewind (ProtocolError / Busy: nothing changed); the future of its reply."""
        stream = self._open(req.session_id, current)
        k = req.to_chunk
        self._check(stream, k, low=0)
        paths = self._take_back(stream, k) if k < stream.next_chunk else None
        return asyncio.ensure_future(self._rewound(stream, k, paths))

    def _take_back(self, stream: Stream, k: int) -> dict[str, str]:
        """The stream becomes its state after chunk k - 1: old incarnation closed, made again
        under new keys from its snapshot after k chunks (where the replicas keep one), else by
        the journal's replay."""
        dit_source, vae_source = self._rebuild.sources(stream, k)
        self._rebuild.inherit(stream, stream, k)
        was_materialised = stream.materialised
        old_dit, old_vae = stream.rewind_to(k)  # journal truncated, new keys
        for follower in self._followers:  # its prefix cursor, what its client has and may be sent again
            follower.rewound(stream, k)
        if was_materialised:  # closed behind its calls, and by the socket's end if that comes first
            self._releases.retire(old_dit, old_vae)
        paths: dict[str, str] = {}  # restored below, also one the prefix store served so far
        stream.opening(vae=self._vae_lane.submit(lambda: self._placed(
                           stream, lambda: self._rebuild.vae(stream, vae_source, paths, k))),
                       dit=self._dit_lane.submit(lambda: self._placed(
                           stream, lambda: self._rebuild.dit(stream, dit_source, paths))))
        return paths

    async def _placed(self, stream: Stream, call) -> str:
        """`call()` until a replica takes it: the slot its old incarnation freed may be taken
        meanwhile, or routed to another replica that is full (up to `recovery_timeout_s`)."""
        deadline = time.monotonic() + self._sessions.recovery_timeout_s
        while True:
            try:
                return await call()
            except Busy as e:
                if time.monotonic() + e.retry_after_s > deadline or stream.state is not StreamState.OPEN:
                    raise
                await asyncio.sleep(min(e.retry_after_s, PLACE_RETRY_S))

    async def _rewound(self, stream: Stream, k: int, paths: Optional[dict[str, str]]) -> BaseModel:
        """`paths`: how each lane made the session again (None: a rewind to its head, nothing to do)."""
        failed = await self._rebuilt(stream)
        if failed is None and paths is not None:
            self._log.info("session rewound", fields={"session": stream.key, "to_chunk": k,
                                                      "path": paths.get("dit"), "vae_path": paths.get("vae")})
        return failed or Rewound(session_id=stream.spec.session_id, next_chunk_id=k)

    # ---- shared ----

    def _open(self, session_id: str, current: Optional[Stream]) -> Stream:
        """The open session `session_id` of this connection (current or held)."""
        stream = current if current is not None and current.spec.session_id == session_id else self._held.get(session_id)
        if stream is None:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this connection holds no session of that `session_id`; "
                                                       "fork and rewind work on this connection's own sessions")
        if stream.state is not StreamState.OPEN:
            raise ProtocolError(ErrorCode.SESSION_LOST, "the server no longer holds this session; "
                                                        "send image and prompt to start it again")
        return stream

    def _check(self, stream: Stream, k: int, low: int, need_journal: bool = True) -> None:
        """A chunk in range, no chunk in flight, no rebuild in flight, a journal to rebuild from
        (`need_journal`). One rebuild at a time: a rebuild reads the stream's keys, chunk count
        and journal when its lane job runs, so a second one queued behind it would rebuild under
        the later one's keys and leave the first's open (issue 43)."""
        if any(not t.done() for t in stream.chunk_tasks):
            raise Busy("the session has a chunk in flight; send this again once its reply came", IN_FLIGHT_RETRY_S)
        if any(f is not None and not f.done() for f in (stream.vae_open, stream.dit_open)):
            raise Busy("the session is being rebuilt (its fork or rewind is not answered yet); send this again "
                       "once it is", IN_FLIGHT_RETRY_S)
        if need_journal and not stream.journal.recoverable:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{self._rebuild.no_journal_why()}: it can be forked at its "
                                                     "last chunk only (a copy of the live session), not rewound "
                                                     "or forked earlier")
        if not low <= k <= stream.next_chunk:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"the chunk must be in {low}..{stream.next_chunk} (the "
                                                       "chunks the session produced)")

    async def _rebuilt(self, stream: Stream) -> Optional[BaseModel]:
        """None once both restores are done; else the error reply (the stream is failed and released)."""
        sid = stream.spec.session_id
        opens = [f for f in (stream.vae_open, stream.dit_open) if f is not None]
        results = await asyncio.gather(*opens, return_exceptions=True)
        error = next((r for r in results if isinstance(r, BaseException)), None)
        if error is None:
            return None
        self._releases.fail(stream)
        if isinstance(error, ReplicaError):
            return self._replies.error(error.code, error.message, sid, getattr(error, "retry_after_s", None))
        self._log.warning("fork or rewind rebuild failed", fields={"session": stream.key, "error": repr(error)})
        return self._replies.error(ErrorCode.SESSION_LOST, f"the server could not rebuild this session "
                                                           f"({type(error).__name__}); send image and prompt to "
                                                           "start it again", sid)
