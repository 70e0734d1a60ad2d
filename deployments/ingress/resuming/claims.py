"""Claims: a `Connection`'s frame that claims a parked session (resume.py), handled before the
next frame is read.

A `resume` request, or an infer with `resume_token`, is claimed from the parking; a `check`
only asks it. A claim that succeeds makes the resumed session the connection's current one,
puts it back in its shared world (sharing/owner.py), sends the missed replies again in order
and starts its driver again when it was driven (paused until a control with keys). A claim
that fails answers an error: `world_changed` with the world to `reopen` (worlds/changes.py),
`busy` (not the client's fault unless its claims are throttled), `session_lost` when the
parking is unreachable (nothing was claimed).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from deployments.errors import ReplicaError
from deployments.ingress.drive.driving import Driving
from deployments.ingress.outbox import Outbox
from deployments.ingress.replies import Replies
from deployments.ingress.resume import ClaimsThrottled, ResumeBook
from deployments.ingress.sharing.owner import Sharing
from deployments.ingress.stream import Stream
from deployments.ingress.worlds.changes import with_world
from deployments.log import KeyValueLog
from protocol.errors import ErrorCode
from protocol.messages import FrameReply, Request, ResumeRequest


class Claims:
    """Claims parked sessions for one connection; `current` and `make_current` read and set its
    current stream."""

    def __init__(self, resume: ResumeBook, sharing: Sharing, driving: Driving, outbox: Outbox, replies: Replies,
                 log: KeyValueLog, current: Callable[[], Optional[Stream]],
                 make_current: Callable[[Stream], None]) -> None:
        self._resume = resume
        self._sharing = sharing
        self._driving = driving
        self._outbox = outbox
        self._replies = replies
        self._log = log
        self._current = current
        self._make_current = make_current

    async def handle(self, req: Request, kind: str) -> Optional[tuple[bool, bool]]:
        """Claim (or check) what `req` asks (`kind`: `ResumeBook.kind`): (refused, infer) as
        `Connection._handle` answers, or None when the frame goes on (an infer that carried a
        token, after its claim)."""
        try:
            if kind == "check":
                await self._resume.check_parked(req)
            else:
                stream, replies, driven = await self._resume.resume(req, self._current())
                self._make_current(stream)
                self._sharing.resumed(stream)  # back in its world, if it has one (sharing/owner.py)
                for reply in replies:
                    self._outbox.reply_now(reply, stream if isinstance(reply, FrameReply) else None)
                self._driving.stop()  # a driven session it replaced
                if driven:  # paused until a control with keys (PROTOCOL.md, drive)
                    self._driving.start(stream)
        except ReplicaError as e:  # world_changed: with the world to `reopen` (worlds/changes.py)
            self._outbox.reply_now(with_world(self._replies.error(e.code, e.message, req.session_id,
                                                                  getattr(e, "retry_after_s", None)), e))
            return e.code is not ErrorCode.BUSY or isinstance(e, ClaimsThrottled), False
        except Exception as e:  # noqa: BLE001 - the parking is unreachable: nothing was claimed
            self._log.warning("resume failed", fields={"session": req.session_id, "error": repr(e)})
            self._outbox.reply_now(self._replies.error(
                ErrorCode.SESSION_LOST, "the server could not resume this session "
                f"({type(e).__name__}); send image and prompt to start it again", req.session_id))
            return False, False
        if isinstance(req, ResumeRequest):
            return False, False
        return None
