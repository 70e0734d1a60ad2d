"""WatchForks: a connection's `fork` of a shared world it may watch ("take it from here").

`fork {session_id: world_id, new_session_id, world_id, watch_token}` on the camera route: the
hub checks the token and the share's audience (book.py `may_fork`: a `principal` share only
for the owner's key) and asks the world's owner side for its head (fork_asks.py,
fork_source.py: the journal of the chunks its viewers were sent, through Ray's object store).
The new session is this connection's, of its principal, in place of its current one, like an
`open` of a saved world (worlds/requests.py): a fresh routing key no replica holds, so that
its first call on each deployment rebuilds it from the journal (history/recovery.py) on
whichever replicas have room, through the same admission (a seat, or a place in the line),
and it continues byte-identical to what the owner's session would make for the same inputs.
The receive loop waits for the head (as for an `open`), so that the infers after the fork
continue it. `forked {session_id, parent_session_id: world_id, next_chunk_id, resume_token,
init_segment}`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Optional

from ray.serve.handle import DeploymentHandle

from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.ingress.detached import settle
from deployments.ingress.outbox import Outbox
from deployments.ingress.releases import Releases
from deployments.ingress.resume import ResumeBook
from deployments.ingress.sharing.fork_source import WorldHead
from deployments.ingress.stream import Stream
from deployments.wire import owner_tag, routing_key
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, ForkRequest, Forked

ASK_TIMEOUT_S = 20.0  # the owner side's answer, at most (its poll renews every 10 s)
HUB_TIMEOUT_S = ASK_TIMEOUT_S + 10.0


class WatchForks:
    """Forks of shared worlds on one connection (module doc). `hub` None: sharing is off."""

    def __init__(self, hub: Optional[DeploymentHandle], args: AppArgs, principal: str, releases: Releases,
                 resume: ResumeBook, stop_driving: Callable[[], None]) -> None:
        self._hub = hub
        self._args = args
        self._principal = principal
        self._releases = releases
        self._resume = resume
        self._stop_driving = stop_driving

    async def handle(self, req: ForkRequest, cur: Optional[Stream], outbox: Outbox) -> Optional[Stream]:
        """Answer `req` through `outbox`; the connection's current stream after it."""
        stream, reply = await self._fork(req, cur)
        outbox.reply_now(reply)
        return stream if stream is not None else cur

    async def _fork(self, req: ForkRequest, cur: Optional[Stream]) -> tuple[Optional[Stream], object]:
        sid = req.new_session_id
        if self._hub is None:
            return None, self._error(ErrorCode.BAD_MESSAGE, "this server does not share worlds "
                                                            "(`sharing.enabled` is off)", req)
        if not self._args.sessions.recovery:
            return None, self._error(ErrorCode.BAD_MESSAGE, "this server does not rebuild sessions "
                                                            "(sessions.recovery is off): a world cannot be forked", req)
        call = self._hub.fork_head.remote(req.world_id, req.watch_token, self._principal, ASK_TIMEOUT_S)
        ended, result = await settle(call, HUB_TIMEOUT_S)
        if isinstance(result, ReplicaError):  # the token, the audience (unauthorized), no answer (busy)
            return None, self._error(result.code, result.message, req, getattr(result, "retry_after_s", None))
        if not ended or isinstance(result, BaseException):
            return None, self._error(ErrorCode.BUSY, "the world hub did not answer; try again", req, 5.0)
        answer, init = result
        if isinstance(answer, ReplicaError):  # the owner side's: no chunk yet, too large
            return None, self._error(answer.code, answer.message, req)
        try:
            head: WorldHead = await answer[0]
        except Exception:  # noqa: BLE001 - the owner's replica (the object's owner) is gone
            return None, self._error(ErrorCode.BUSY, "the world's owner went away while it was forked; try again",
                                     req, 5.0)
        spec = dataclasses.replace(head.spec, session_id=sid, owner=owner_tag(self._principal))
        key = routing_key(sid, spec.owner)  # no replica holds it: its first calls rebuild it (recovery.py)
        n, journal = head.chunks, head.journal
        stream = Stream.resumed(spec, journal, head.image, (key, key, key), n, journal.prompt_after(n, spec.prompt))
        try:
            self._releases.adopt(stream, replacing=cur)  # the key's session quota: busy, nothing changed
        except ReplicaError as e:
            return None, self._error(e.code, e.message, req, getattr(e, "retry_after_s", None))
        self._stop_driving()  # a driven session it replaced
        token = self._resume.opened(stream)
        return stream, Forked(session_id=sid, parent_session_id=req.world_id, next_chunk_id=n, resume_token=token,
                              init_segment=init)

    @staticmethod
    def _error(code: ErrorCode, message: str, req: ForkRequest, retry_after_s: Optional[float] = None) -> ErrorReply:
        return ErrorReply(code=code, message=message, session_id=req.new_session_id,
                          retry_after_s=retry_after_s if code is ErrorCode.BUSY else None)
