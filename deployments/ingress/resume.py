"""Resume: a `Connection`'s side of sessions that outlive their socket (parking.py).

* A session's first frame reply carries its `resume_token` (`ResumeBook.token`, issued when
  the stream opens and `sessions.resume.grace_s` > 0).
* When the socket ends, `park` hands the open session to the parking instead of
  closing it: announced at once (a quick reconnect waits for it), then, once the chunks in
  flight are answered (however long they take, within the grace period), its journal, keys,
  counters, the last `sessions.resume.replay_chunks` sent replies and every reply the socket could not
  send (those of the chunks in flight at the drop included). The replica state stays where it is.
* On a new socket, a `resume` request, or an infer with `resume_token`, claims it
  (`resume`) before anything else of that socket is read: the missed replies go out again in
  order (those from `resume_from` on; without it, the unsent ones), then the session goes on.
  A clip-mode connection (deployments/clip) claims its client's clip session by session id.
  A token the parking does not know is asked for once more after `UNKNOWN_WAIT_S` (the old
  socket's end may not have been seen yet): that wait, and the one of a client whose claims
  keep failing (claim_gate.py), happen here, in the claiming connection, never in the parking.

`ResumeBook` is told the connection's current stream with each call and returns the stream a
claim makes current; the sessions it adopts and the ones they replace go through `Releases`.
It keeps, per stream, what a resume needs (`Delivery`: the token, what was sent, the replies
kept to send again); only it writes that record (the send loop tells it what was sent, a fork
or a rewind what they took back).
"""
from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional, Protocol

from pydantic import BaseModel

from camera import CHUNK_LATENT_FRAMES
from deployments.ingress.detached import detach, settle
from deployments.errors import Busy, Unauthorized
from deployments.ingress.lanes import ReplicaLanes
from deployments.ingress.parking import ClaimRefused, ParkedSession, new_token, token_digest
from deployments.ingress.guards.quotas import KeyQuota
from deployments.ingress.releases import Releases
from deployments.ingress.stream import Stream, StreamState
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import FrameReply, InferRequest, Request, ResumeOk, ResumeRequest

CLIP_RESUME = "\x00clip"  # resume_token of a clip-mode extension on a new socket (never a real token)
PARK_CALL_S = 10.0  # a parking call that takes longer is given up (the session then ends as before)
UNKNOWN_WAIT_S = 2.0  # a claim of a token the parking does not know is made again after this long


class StoredSessions(Protocol):
    """The sessions kept in the world store (worlds/sessions.py): a claim the parking does not
    know is looked up there; a resumed session writes on in its world."""

    async def revive(self, session_id: str, token: str) -> Optional[ParkedSession]: ...

    def resumed(self, stream: Stream) -> None: ...


class ClaimsThrottled(Busy):
    """This client's resume claims failed too often: not made (claim_gate.py)."""


@dataclass(slots=True)
class Delivery:
    """What one stream's client was sent, and what a resume of it needs."""

    token: Optional[str] = None  # the chunk-0 reply's resume token (None: not resumable, or resumed here)
    digest: Optional[str] = None  # the token's digest: the parking's key
    token_delivered: bool = False  # the client has the token
    sent: int = 0  # chunk replies sent on this socket (chunk ids below it)
    replay: deque = field(default_factory=lambda: deque(maxlen=0))  # the last sent FrameReplies, to send again
    pending: deque = field(default_factory=deque)  # replies a resume sends again, not yet sent


class ResumeBook:
    """Parks the open session when the socket ends; resumes parked ones."""

    def __init__(self, replicas: ReplicaLanes, releases: Releases, quota: Optional[KeyQuota], *, may_park: bool, clip_mode: Callable[[], bool], key_id: Optional[str],
                 client: Optional[str], worlds: Optional[StoredSessions] = None) -> None:
        """`may_park`: a WebSocket's connection (not an offline video's); `clip_mode`: whether the
        socket is a peer client's in clip mode, asked when needed (a peer transport chooses its
        mode with its first request, after this book is made); `key_id`, `client`: its API key id
        (auth on) and address; `worlds`: the sessions kept in the world store (None: none)."""
        self._parking = replicas.backends.parking
        self._claims = replicas.backends.claims
        self._sessions = replicas.args.sessions
        self._releases = releases
        self._line = replicas.line  # the connection's LineSeats: a session no replica holds waits its turn again
        self._quota = quota
        self._log = replicas.log
        self._may_park = may_park
        self._clip_mode = clip_mode
        self._key_id = key_id
        self._client = client
        self.worlds = worlds
        self._deliveries: weakref.WeakKeyDictionary[Stream, Delivery] = weakref.WeakKeyDictionary()

    def _of(self, stream: Stream) -> Delivery:
        d = self._deliveries.get(stream)
        if d is None:
            d = self._deliveries[stream] = Delivery()
        return d

    # ---- a stream's record ----

    def issue(self, stream: Stream) -> None:
        """A new session: its resume token, when this connection's sessions may outlive it."""
        if self.enabled:
            token = new_token()
            self._deliveries[stream] = Delivery(token, token_digest(token),
                                                replay=self.replay_ring(stream.spec.raw_frames))

    def opened(self, stream: Stream) -> Optional[str]:
        """A session opened from a saved world (worlds/requests.py): its resume token, which the
        `opened` reply carries (no chunk-0 reply will); its client has its chunks."""
        if not self.enabled:
            return None
        token = new_token()
        self._deliveries[stream] = Delivery(token, token_digest(token), token_delivered=True, sent=stream.next_chunk,
                                            replay=self.replay_ring(stream.spec.raw_frames))
        return token

    def token(self, stream: Stream) -> Optional[str]:
        """The resume token its chunk-0 reply carries (None: none)."""
        d = self._deliveries.get(stream)
        return None if d is None else d.token

    def digest_of(self, stream: Stream) -> Optional[str]:
        """The digest of `stream`'s resume token (None: it has none)."""
        d = self._deliveries.get(stream)
        return None if d is None else d.digest

    def sent_chunks(self, stream: Stream) -> int:
        """Chunk replies of `stream` sent on this socket (a resumed one: those its client has)."""
        d = self._deliveries.get(stream)
        return 0 if d is None else d.sent

    def record_sent(self, stream: Stream, reply: FrameReply) -> None:
        """The send loop sent a frame reply of `stream` (what a park keeps, see the module doc)."""
        d = self._of(stream)
        d.sent = max(d.sent, reply.chunk_id + 1)
        d.replay.append(reply)
        if d.pending and d.pending[0] is reply:
            d.pending.popleft()
        if reply.resume_token is not None:
            d.token_delivered = True

    def forked(self, new: Stream, source: Stream, k: int) -> None:
        """`new` is `source` after k chunks (branching.py): its client has them; no token."""
        self._deliveries[new] = Delivery(sent=k)

    def rewound(self, stream: Stream, k: int) -> None:
        """`stream` was taken back to k chunks (branching.py): nothing of later chunks is kept."""
        d = self._of(stream)
        d.sent = min(d.sent, k)
        d.replay = deque((r for r in d.replay if r.chunk_id < k), maxlen=d.replay.maxlen)
        d.pending = deque(r for r in d.pending if r.chunk_id < k)

    @property
    def clip_mode(self) -> bool:
        return self._clip_mode()

    @property
    def enabled(self) -> bool:
        return self._may_park and self._parking is not None and self._sessions.resume.grace_s > 0

    def _principal(self, clip: bool) -> Optional[str]:
        """Who may resume: the API key (auth on), else the client address (issue 43: without
        auth every session was parked under one principal, so another address's parked id
        answered `unauthorized` where an unknown one answers `missing_field`, and a client could
        not name its own session like another's parked one). `clip` changes nothing since."""
        return self._key_id if self._key_id is not None else f"addr:{self._client}"

    @property
    def _owner(self) -> str:
        """Whose bounds a parked session and a failed claim count against: the API key (auth
        on), else the client address (anonymous clients never share one bucket)."""
        return f"key:{self._key_id}" if self._key_id is not None else f"addr:{self._client}"

    # ---- the socket ended ----

    async def park(self, s: Optional[Stream], driven: bool = False) -> bool:
        """Park the connection's open session `s` (see the module doc; `driven`: the server
        drives it, drive/); True when parked (the parking holds it now: its connection releases
        nothing of it)."""
        d = None if s is None else self._deliveries.get(s)
        if not (self.enabled and s is not None and d is not None and s.state is StreamState.OPEN and d.digest
                and d.token_delivered):  # a client that never got chunk 0 has no token
            return False
        digest, clip = d.digest, s.spec.raw_frames
        parking = self._parking
        if not await self._call(parking.reserve.remote(digest, s.spec.session_id, self._principal(clip), clip,
                                                      self._owner)):
            return False
        pending = [t for t in s.chunk_tasks if not t.done()]
        if pending:  # their replies are the ones the client missed: parked with the session
            await asyncio.wait(pending, timeout=self._sessions.resume.grace_s)
        replies = [t.result() for t in s.chunk_tasks if t.done() and not t.cancelled()]
        if s.state is not StreamState.OPEN or len(replies) < len(s.chunk_tasks) or not all(
                isinstance(r, FrameReply) for r in replies):  # a chunk failed or is still running
            self._log.warning("session not parked: a chunk failed or is still running", fields={
                "session": s.key, "state": s.state.name, "chunks": len(s.chunk_tasks), "answered": len(replies),
                "errors": [getattr(r, "code", None) for r in replies if not isinstance(r, FrameReply)]})
            await self._call(parking.unreserve.remote(digest))
            return False
        unsent = [*d.pending, *(r for r in replies if r.chunk_id >= d.sent)]
        total = s.spec.total_latent_frames
        ended = s.next_chunk >= self._sessions.max_chunks or (
            total is not None and s.next_chunk >= total // CHUNK_LATENT_FRAMES)
        record = ParkedSession(
            spec=s.spec, journal=s.journal, image=s.image, key=s.key, dit_key=s.dit_key, vae_key=s.vae_key,
            next_chunk=s.next_chunk, sent=d.sent, prompt=s.prompt, replies=[*d.replay, *unsent], token_digest=digest,
            principal=self._principal(clip), clip=clip, driven=driven,
            held=self._line is None or not self._line.yielded(s))
        if not await self._call(parking.park.remote(record)):
            return False
        if ended:  # no chunk is left to make: its replicas free it now, the parking keeps its replies
            self._log.info("ended session parked for its replies", fields={"session": s.key})
            return False
        if s.state is not StreamState.CLOSED:
            s.close()  # the parking holds it now: this connection releases nothing of it
        self._log.info("session parked", fields={"session": s.key, "chunks": s.next_chunk,
                                                 "unsent": len(unsent), "grace_s": self._sessions.resume.grace_s})
        return True

    def forget_parked_clip(self, session_id: str) -> None:
        """A new clip session `session_id` starts here: the parking drops its client's parked
        one of that id (sent now, so it reaches the parking before any later claim)."""
        detach(self._call(self._parking.discard_clip.remote(session_id, self._principal(True))),
               name=f"discard-clip-{session_id}")

    async def _call(self, call) -> bool:
        ended, result = await settle(call, PARK_CALL_S)
        if not ended or isinstance(result, BaseException) or result is False:
            self._log.warning("parking call failed; the session ends with its socket",
                              fields={"error": repr(result) if ended else "timeout"})
            return False
        return True

    # ---- a new socket resumes ----

    def kind(self, req: Request, cur: Optional[Stream]) -> Optional[str]:
        """"claim" when `req` resumes a session this connection (current stream `cur`) does not
        hold; "check" when it continues one it does not hold without a token (the parking may
        hold it); else None."""
        if not self.enabled or not isinstance(req, (InferRequest, ResumeRequest)):
            return None
        if cur is not None and cur.spec.session_id == req.session_id and cur.state is StreamState.OPEN:
            return None
        if isinstance(req, ResumeRequest) or req.resume_token is not None:
            return "claim"
        if req.image is None and req.prompt_update is None:
            return "check"
        return None

    async def resume(self, req: Request, cur: Optional[Stream]) -> tuple[Stream, list[BaseModel], bool]:
        """Claim the parked session `req` names and make it this connection's in place of `cur`;
        the stream, the replies to send again (in order) and whether the server drives it. Raises ReplicaError
        (unauthorized, session_lost, busy)."""
        clip = req.resume_token == CLIP_RESUME and self.clip_mode
        token = None if clip else req.resume_token
        if self._quota is not None:  # before the claim: a session claimed is never dropped for the quota
            self._quota.check_session(_open_key(cur))
        record = await self._claim(req.session_id, token, self._principal(clip), clip)
        # the client has at most the replies the old socket sent: a `resume_from` beyond them
        # would open a driven session's ack window past every chunk (issue 43): it counts as them
        resume_from = record.next_chunk if clip else min(record.sent, req.resume_from if req.resume_from is not None
                                                         else record.sent)
        stream = self._install(record, resume_from, cur)
        if self.worlds is not None:
            self.worlds.resumed(stream)  # it writes on in its world
        replay = [r for r in record.replies if r.chunk_id >= resume_from]
        missing = sorted(set(range(resume_from, record.next_chunk)) - {r.chunk_id for r in replay})
        if missing:
            self._log.warning("resume: replies no longer kept", fields={"session": stream.key, "chunks": missing})
        self._log.info("session resumed", fields={"session": stream.key, "chunks": record.next_chunk,
                                                  "replayed": len(replay)})
        self._of(stream).pending.extend(replay)  # parked with the session if the socket drops before they are sent
        out: list[BaseModel] = list(replay)
        if isinstance(req, ResumeRequest):
            out.append(ResumeOk(session_id=req.session_id, next_chunk_id=record.next_chunk, replayed=len(replay)))
        return stream, out, record.driven

    async def _claim(self, session_id: str, token: Optional[str], principal: Optional[str],
                     clip: bool) -> ParkedSession:
        """The parked session, claimed through this client's gate (see the module doc). Raises
        ClaimsThrottled, Unauthorized or SessionLost."""
        sessions, gate, who = self._sessions, self._claims, self._owner
        rate, burst = sessions.resume.failed_claims_per_minute, sessions.resume.failed_claims_burst
        wait = gate.take(who, rate, burst)
        if wait is None:
            retry = gate.retry_in(who, rate, burst)
            self._log.debug("resume refused: too many failed claims", fields={"session": session_id,
                                                                             "retry_after_s": round(retry, 1)})
            raise ClaimsThrottled("too many resume claims of this client failed; try again later", retry)
        if wait > 0:
            await asyncio.sleep(wait)
        result = await self._parking.claim.remote(session_id, token, principal, clip)
        if isinstance(result, ClaimRefused) and result.unknown:  # its old socket's end may not be seen yet
            await asyncio.sleep(UNKNOWN_WAIT_S)
            result = await self._parking.claim.remote(session_id, token, principal, clip)
        if isinstance(result, ClaimRefused) and result.unknown and token is not None and self.worlds is not None:
            revived = await self.worlds.revive(session_id, token)  # a session of an earlier app (worlds/revive.py)
            if revived is not None:
                revived.principal, revived.clip = principal, clip
                self._log.info("session revived from the world store", fields={"session": session_id,
                                                                               "chunks": revived.next_chunk})
                result = revived
        if isinstance(result, ClaimRefused):
            self._log.info("resume refused", fields={"session": session_id, "code": result.code.value,
                                                     "why": "unknown token" if result.unknown else result.message})
            raise result.error()
        gate.give_back(who, burst)
        return result

    def replay_held(self, req: ResumeRequest, s: Optional[Stream]) -> list[BaseModel]:
        """`resume` of the session this connection holds (`s`): its kept replies from
        `resume_from` on, again."""
        if not self.enabled:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this server does not resume sessions (the handshake has no "
                                                       "`resume_grace_s`): sessions end with their connection")
        d = None if s is None else self._deliveries.get(s)
        if d is None or d.digest is None or token_digest(req.resume_token) != d.digest:
            raise Unauthorized(f"the resume token is not session {req.session_id!r}'s")
        start = d.sent if req.resume_from is None else req.resume_from
        replay = [r for r in d.replay if r.chunk_id >= start]
        return [*replay, ResumeOk(session_id=req.session_id, next_chunk_id=s.next_chunk, replayed=len(replay))]

    async def check_parked(self, req: InferRequest) -> None:
        """An infer that continues a session this connection does not hold, without a token:
        Unauthorized when the parking holds it (it needs its token), else nothing."""
        if await self._parking.holds.remote(req.session_id, self._principal(self.clip_mode)):
            raise Unauthorized(f"session {req.session_id!r} waits to be resumed: send the `resume_token` of its "
                               "first frame reply with `session_id` (a `resume` request, or this infer with it)")

    def _install(self, record: ParkedSession, sent: int, cur: Optional[Stream]) -> Stream:
        """A stream from a parked session, to be this connection's current one in place of
        `cur`; `sent`: the chunk replies its client has."""
        stream = Stream.resumed(record.spec, record.journal, record.image, (record.key, record.dit_key, record.vae_key),
                                record.next_chunk, record.prompt)
        d = self._deliveries[stream] = Delivery(  # parked again under the same token
            digest=record.token_digest, token_delivered=True, sent=sent,  # the client sent it
            replay=self.replay_ring(record.spec.raw_frames))
        d.replay.extend(r for r in record.replies if r.chunk_id < record.sent)
        self._releases.adopt(stream, replacing=cur)
        if not record.held:  # it yielded its seat (no replica holds it): its next chunk rebuilds it after its turn
            stream.served_from_store()
            if self._line is not None:
                self._line.rejoin(stream)
        return stream

    def replay_ring(self, raw_frames: bool) -> deque:
        """The sent replies a stream keeps to send again (none of raw clip frames: too large)."""
        return deque(maxlen=0 if raw_frames else self._sessions.resume.replay_chunks)


def _open_key(cur: Optional[Stream]) -> Optional[str]:
    """The key of the connection's open session (a new or resumed one replaces it)."""
    return cur.key if cur is not None and cur.state is StreamState.OPEN else None

