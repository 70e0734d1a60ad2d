"""Session parking: where a session waits, between a dropped socket and its resume.

When a client's socket ends while its session is open, the connection (resume.py,
`ResumeBook.park`) does not close the session on the replicas: it waits for the session's
chunks in flight, then hands the session's connection-side state (its journal, keys, chunk
counter and the replies the client may have missed) to `SessionParking`, one replica for the
application, reachable from every ingress replica. A new socket, through any ingress replica,
claims it with the session's `resume_token` and carries on: its first calls reach the replicas
that still hold the session (the router follows the replicas' reported keys), or, when one lost
it meanwhile, a rebuild from the journal (recovery.py). After `sessions.resume.grace_s` without
a claim the parking closes the session on the replicas and forgets it.

`ParkingBook` is the bookkeeping (no Ray): bounded in sessions, bytes and sessions per owner
(the API key with auth on, else the client address: one owner's sessions never evict
another's); tokens are kept and looked up as SHA-256 digests only (the token itself is never
stored or logged); a token that ended is remembered for a while with why (grace period over,
evicted, replaced), so that its late resume is told that (`session_lost`) rather than that the
token is wrong (`unauthorized`).

Nothing here waits on behalf of a token it does not know: a claim of an unknown token is
answered at once (`ClaimRefused.unknown`), and the connection, in the ingress, waits and asks
again (resume.py); failed claims are rate limited there, per owner (claim_gate.py). The only
wait in the replica is a claim of a session its old connection is still parking (the token
holder's own session). The replica takes many requests at once (`MAX_ONGOING`): it only keeps
books, so parks are never queued behind claims.
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import SessionArgs
from deployments.errors import ReplicaError, SessionLost, Unauthorized
from deployments.ingress.journal import SessionJournal
from deployments.log import get_log, log_routine_access_at_debug
from deployments.wire import SessionOptions
from protocol.errors import ErrorCode

TOKEN_BYTES = 24  # 192 bits, url-safe base64: 32 characters
PENDING_WAIT_S = 40.0  # a claim waits this long for a session its old connection is still parking
TOMBSTONES = 4096  # ended tokens remembered (FIFO)
TOMBSTONE_S = 3600.0
SWEEP_PERIOD_S = 0.5
MAX_PER_CLIENT = 4  # parked sessions of one owner (API key, or address without auth); its oldest goes
MAX_ONGOING = 1024  # requests the parking replica takes at once (bookkeeping only: never the bottleneck)

# Why a parked session ended before it was claimed (a late claim is told).
EXPIRED, EVICTED, REPLACED = "expired", "evicted", "replaced"


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(slots=True)
class ParkedSession:
    """A session's connection-side state, as its dropped connection left it (see connection.py)."""

    spec: SessionOptions
    journal: SessionJournal
    image: Any  # RGB uint8 [H0, W0, 3] (np.ndarray)
    key: str  # the stream's identity
    dit_key: str
    vae_key: str
    next_chunk: int  # chunks accepted; the next infer produces this chunk_id
    sent: int  # chunk replies the old socket sent (chunk ids below it)
    prompt: str  # after prompt updates
    replies: list  # FrameReply objects kept for re-sending: the last sent ones and every unsent one, in order
    token_digest: str = ""
    principal: Optional[str] = None  # API key id (auth on) or client address; a claim must match
    clip: bool = False  # opened in clip mode: a clip-mode connection of the same principal claims it by session id
    driven: bool = False  # opened by `drive`: resumed paused, driven again by the server (drive/driver.py)
    held: bool = True  # False: it yielded its seat to the line (no replica holds it): resumed, its next chunk
                       # rebuilds it after its turn in line (line/seat.py)

    @property
    def session_id(self) -> str:
        return self.spec.session_id

    @property
    def nbytes(self) -> int:
        return self.journal.nbytes + sum(len(r.video) for r in self.replies)


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """A claim the parking refused (returned, not raised: a refusal is an answer, not a failure
    of the call). `unknown`: no such token, nor one that ended (its old connection may not
    have announced it yet: the claimant may ask once more)."""

    code: ErrorCode
    message: str
    unknown: bool = False

    def error(self) -> ReplicaError:
        return (SessionLost if self.code is ErrorCode.SESSION_LOST else Unauthorized)(self.message)


class UnknownToken(Unauthorized):
    """A claim of a token the parking does not know (see `ClaimRefused.unknown`)."""


class UnknownClip(SessionLost):
    """A clip-mode claim of a session id the parking does not hold for that client (likewise)."""


@dataclass(slots=True)
class _Entry:
    session_id: str
    principal: Optional[str]
    owner: str  # whose bound it counts against (API key, or address without auth)
    clip: bool
    deadline: float  # monotonic: expiry of the grace period
    record: Optional[ParkedSession] = None  # None while its connection is still parking it
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set when parked or dropped

    @property
    def nbytes(self) -> int:
        return 0 if self.record is None else self.record.nbytes


class ParkingBook:
    """Parked sessions by token digest, with their bounds (no Ray; `SessionParking` runs it)."""

    def __init__(self, grace_s: float, max_sessions: int, max_bytes: int, max_per_client: int = MAX_PER_CLIENT,
                 clock=time.monotonic) -> None:
        self.grace_s = grace_s
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._max_per_client = max_per_client
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # digest -> entry, oldest first
        self._ended: OrderedDict[str, tuple[float, str]] = OrderedDict()  # digest -> (when, why) it ended

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def reserve(self, digest: str, session_id: str, principal: Optional[str], clip: bool,
                owner: Optional[str] = None) -> tuple[bool, list[ParkedSession]]:
        """Announce a session its connection is about to park: (accepted, the records evicted to
        make room, whose replica state must be closed). Only the same owner's sessions are
        evicted (its oldest beyond `max_per_client`, or when the parking is full); when the
        parking is full of other owners' sessions, this one is refused (it ends with its socket).
        `owner`: whose bound it counts against (default: `principal`)."""
        owner = owner if owner is not None else str(principal)
        self._ended.pop(digest, None)
        old = self._entries.pop(digest, None)  # the same session parked again (resumed, dropped again)
        evicted = [old.record] if old is not None and old.record is not None else []
        if clip:  # one clip session per (client, session id): a newer one replaces it
            evicted += self.discard_clip(session_id, principal)
        mine = [d for d, e in self._entries.items() if e.owner == owner]
        excess = max(0, len(mine) - self._max_per_client + 1, len(self._entries) - self._max_sessions + 1)
        if excess > len(mine):
            return False, evicted
        for d in mine[:excess]:
            evicted += self._drop(d, EVICTED)
        self._entries[digest] = _Entry(session_id, principal, owner, clip, self._clock() + self.grace_s)
        return True, evicted

    def park(self, record: ParkedSession) -> bool:
        """Fill a reserved entry; False (nothing kept) when it was not reserved, was claimed
        meanwhile, or would take the parking over its byte budget."""
        entry = self._entries.get(record.token_digest)
        if entry is None or entry.record is not None:
            return False
        if self.nbytes + record.nbytes > self._max_bytes:
            self.unreserve(record.token_digest)
            return False
        entry.record = record
        entry.deadline = self._clock() + self.grace_s  # the grace counts from when it is resumable
        entry.ready.set()
        return True

    def unreserve(self, digest: str) -> None:
        entry = self._entries.pop(digest, None)
        if entry is not None:
            entry.ready.set()

    async def claim(self, session_id: str, token: Optional[str], principal: Optional[str],
                    clip: bool = False) -> ParkedSession:
        """The parked session `token` (or, for a clip-mode connection, the principal's clip
        session `session_id`) opens, removed from the book. Waits only for one its old
        connection is still parking. Raises UnknownToken (no such session: perhaps not yet
        announced), Unauthorized (wrong token, session or key) or SessionLost (it ended)."""
        digest = self._find_clip(session_id, principal) if clip and token is None else (
            token_digest(token) if token is not None else None)
        if digest is None and clip:
            raise UnknownClip(f"session {session_id!r} is not open on this connection and no session of that id "
                               f"waits to be resumed (a session stays resumable {self.grace_s:g} s after its "
                               "connection closed); send `image` to start it again")
        if digest is None:
            raise Unauthorized(f"session {session_id!r} is not open on this connection: send the `resume_token` "
                               "of its first frame reply to continue it here, or image and prompt to start it again")
        entry = self._entries.get(digest)
        if entry is not None and entry.record is None:
            try:
                async with asyncio.timeout(PENDING_WAIT_S):  # not wait_for: 3.11's can drop a cancellation
                    await entry.ready.wait()
            except TimeoutError:
                raise Unauthorized(f"session {session_id!r} is still being parked (its chunks in flight are "
                                   "running); send `resume` again") from None
            entry = self._entries.get(digest)
        if entry is None or entry.record is None:
            if digest in self._ended:
                raise SessionLost(self._ended_message(session_id, self._ended[digest][1]))
            raise UnknownToken(f"no session {session_id!r} to resume with this token: the token is wrong, or the "
                               "session ended (reset, or its connection closed it)")
        if not (entry.session_id == session_id and entry.principal == principal):
            raise Unauthorized(f"the resume token is not session {session_id!r}'s (or not this API key's)")
        del self._entries[digest]
        return entry.record

    def _ended_message(self, session_id: str, why: str) -> str:
        start = "send image and prompt to start it again"
        if why == EVICTED:
            return (f"session {session_id!r} was evicted from the parking: its client (API key, or address without "
                    f"auth) left more than {self._max_per_client} sessions waiting to be resumed, and this was its "
                    f"oldest; {start}")
        if why == REPLACED:
            return f"session {session_id!r} was replaced by a newer session of that id; {start}"
        return (f"session {session_id!r} was not resumed within the grace period ({self.grace_s:g} s after its "
                f"connection dropped) and was ended; {start}")

    def discard_clip(self, session_id: str, principal: Optional[str]) -> list[ParkedSession]:
        """A new clip session of that id and client started: its parked predecessors can never be
        claimed (a claim must find the new one); their records (replica state to close)."""
        out: list[ParkedSession] = []
        for d in [d for d, e in self._entries.items() if e.clip and (e.principal, e.session_id) == (
                principal, session_id)]:
            out += self._drop(d, REPLACED)
        return out

    def holds(self, session_id: str, principal: Optional[str]) -> bool:
        """Whether a session of that id and principal is parked (or being parked)."""
        return any(e.session_id == session_id and e.principal == principal for e in self._entries.values())

    def sweep(self) -> list[ParkedSession]:
        """Drop the entries whose grace period ended; their records (replica state to close)."""
        now = self._clock()
        out: list[ParkedSession] = []
        for d in [d for d, e in self._entries.items() if e.deadline <= now]:
            out += self._drop(d, EXPIRED)
        while self._ended and next(iter(self._ended.values()))[0] < now - TOMBSTONE_S:
            self._ended.popitem(last=False)
        return out

    def _find_clip(self, session_id: str, principal: Optional[str]) -> Optional[str]:
        for d, e in reversed(self._entries.items()):
            if e.clip and e.principal == principal and e.session_id == session_id:
                return d
        return None

    def _drop(self, digest: str, why: str) -> list[ParkedSession]:
        entry = self._entries.pop(digest)
        entry.ready.set()
        self._ended[digest] = (self._clock(), why)
        while len(self._ended) > TOMBSTONES:
            self._ended.popitem(last=False)
        return [] if entry.record is None else [entry.record]


@serve.deployment(num_replicas=1, max_ongoing_requests=MAX_ONGOING)
class SessionParking:
    """The application's one parking (see the module doc); closes what expires on the replicas."""

    def __init__(self, vae: DeploymentHandle, dit: DeploymentHandle, sessions: SessionArgs) -> None:
        self._vae = vae
        self._dit = dit
        resume = sessions.resume
        self._book = ParkingBook(resume.grace_s, resume.max_sessions, int(resume.max_mib * 1024 * 1024),
                                 resume.max_per_client)
        self._log = get_log("parking")
        log_routine_access_at_debug()  # a `CALL reserve OK` line per parked session: DEBUG
        self._closing: set[asyncio.Task] = set()
        self._expired_total = 0
        self._sweeper = asyncio.get_event_loop().create_task(self._sweep_loop())

    async def reserve(self, digest: str, session_id: str, principal: Optional[str], clip: bool,
                      owner: Optional[str] = None) -> bool:
        accepted, evicted = self._book.reserve(digest, session_id, principal, clip, owner)
        self._close_all(evicted, EVICTED)
        if not accepted:
            self._log.warning("session not parked: the parking is full of other clients' sessions",
                              fields={"session": session_id, "parked": len(self._book)})
        return accepted

    async def park(self, record: ParkedSession) -> bool:
        parked = self._book.park(record)
        self._log.info("session parked" if parked else "session not parked (over budget or gone)", fields={
            "session": record.dit_key, "chunks": record.next_chunk, "bytes": record.nbytes})
        return parked

    async def unreserve(self, digest: str) -> None:
        self._book.unreserve(digest)

    async def claim(self, session_id: str, token: Optional[str], principal: Optional[str],
                    clip: bool = False) -> ParkedSession | ClaimRefused:
        """The parked session, or why not (returned, never raised: a refusal is no failure of
        the call, and Serve would log a traceback for it)."""
        try:
            record = await self._book.claim(session_id, token, principal, clip)
        except ReplicaError as e:
            unknown = isinstance(e, (UnknownToken, UnknownClip))
            self._log.debug("claim refused", fields={"session": session_id, "code": e.code.value,
                                                     "unknown": unknown})  # the claiming connection logs it
            return ClaimRefused(e.code, e.message, unknown)
        self._log.info("session resumed", fields={"session": record.dit_key, "chunks": record.next_chunk})
        return record

    async def holds(self, session_id: str, principal: Optional[str]) -> bool:
        return self._book.holds(session_id, principal)

    async def discard_clip(self, session_id: str, principal: Optional[str]) -> None:
        self._close_all(self._book.discard_clip(session_id, principal), "replaced by a new clip session")

    async def stats(self) -> dict[str, Any]:
        return {"parked": len(self._book), "bytes": self._book.nbytes, "expired": self._expired_total,
                "grace_s": self._book.grace_s, "closing": len(self._closing)}

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_PERIOD_S)
            expired = self._book.sweep()
            self._expired_total += len(expired)
            self._close_all(expired, "grace period ended")

    def _close_all(self, records: list[ParkedSession], why: str) -> None:
        for record in records:
            task = asyncio.ensure_future(self._close(record, why))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close(self, record: ParkedSession, why: str) -> None:
        """Free a parked session on both deployments (routed to their holders by the replicas'
        reported keys); a replica that is gone or cannot be told frees it at its idle TTL."""
        for handle, key in ((self._dit, record.dit_key), (self._vae, record.vae_key)):
            try:
                async with asyncio.timeout(30.0):
                    await handle.options(session_id=key).close.remote(key)
            except Exception as e:  # noqa: BLE001 - the replica's idle TTL frees it then
                self._log.warning("close of a parked session failed", fields={"session": key, "error": repr(e)})
        self._log.info("parked session ended", fields={"session": record.dit_key, "why": why})
