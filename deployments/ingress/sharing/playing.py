"""Playing: what a viewer's socket sends after `watch` (PROTOCOL.md "Players").

On the watch route a viewer may send, with its world's id as `session_id`: `ask_controls`
(become a player; in `turns`, wait for a turn), `control` (a player's key state, the owner's
`control`), `pass_controls` (the holder passes them on) and `prompt` (the director's prompt
steering). Each goes to the hub (hub.py), whose policy (policy.py) takes it or refuses it
(`forbidden`: not a player, not its turn, revoked; nothing changed). Anything else a viewer
sends (`infer`, `rewind`, `reset`...) is refused here with `forbidden` (`bad_message` for what
does not decode), without a hub call.

Controls are coalesced per socket: at most one hub call of its controls is in flight, and a
control that comes meanwhile replaces the one waiting (a key state is the whole state: the
latest is all that matters). A player flooding controls costs the hub one call at a time.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional

from ray.serve.handle import DeploymentHandle

from deployments.errors import ReplicaError
from deployments.ingress.detached import retrieved, settle
from protocol.codec import decode
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import AskControlsRequest, ControlRequest, PassControlsRequest, PromptRequest, Request

HUB_TIMEOUT_S = 10.0
PLAYER_REQUESTS = (AskControlsRequest, ControlRequest, PassControlsRequest, PromptRequest)


def refusal(req: Optional[Request], world_id: str) -> Optional[ProtocolError]:
    """The error a viewer's request gets here (None: it goes to the hub)."""
    if req is None:
        return ProtocolError(ErrorCode.BAD_MESSAGE, "send binary frames holding one msgpack map, not text")
    if not isinstance(req, PLAYER_REQUESTS):
        return ProtocolError(ErrorCode.FORBIDDEN, f"a viewer cannot send `{req.endpoint}`: it watches a world that its "
                                                  "owner drives (a player sends `control`); nothing was changed",
                             req.session_id)
    if req.session_id != world_id:
        return ProtocolError(ErrorCode.FORBIDDEN, f"on the watch route `{req.endpoint}` names the world watched: its "
                                                  "`session_id` is the world's id; nothing was changed",
                             req.session_id)
    return None


class Playing:
    """One viewer socket's requests as a (would-be) player (module doc). `refuse(error)` queues
    an error reply on the socket; `refused` counts the refusals (the socket closes past a bound)."""

    def __init__(self, hub: DeploymentHandle, world_id: str, viewer_id: str, limits: Limits,
                 refuse: Callable[[ProtocolError], None]) -> None:
        self._hub, self._world_id, self._viewer_id, self._limits = hub, world_id, viewer_id, limits
        self._refuse = refuse
        self.refused = 0
        self._control: Optional[ControlRequest] = None  # the latest control not sent to the hub yet
        self._sender: Optional[asyncio.Task] = None
        self._calls: set[asyncio.Task] = set()

    def handle(self, data: Optional[bytes]) -> None:
        """One frame the viewer sent (after `watch`)."""
        try:
            req = decode(data, self._limits) if data is not None else None
        except ProtocolError as e:
            return self._refused(e)
        error = refusal(req, self._world_id)
        if error is not None:
            return self._refused(error)
        if isinstance(req, ControlRequest):
            self._control = req
            if self._sender is None or self._sender.done():
                self._sender = self._spawn(self._send_controls())
            return None
        if isinstance(req, AskControlsRequest):
            call = self._hub.ask.remote(self._world_id, self._viewer_id)
        elif isinstance(req, PassControlsRequest):
            call = self._hub.pass_controls.remote(self._world_id, self._viewer_id, req.viewer_id)
        else:
            call = self._hub.prompt.remote(self._world_id, self._viewer_id, req.prompt)
        self._spawn(self._answered(call, req.session_id))
        return None

    def close(self) -> None:
        """The socket ended: nothing more goes to the hub."""
        for task in [*self._calls]:
            task.cancel()

    # ---- internals ----

    def _refused(self, error: ProtocolError) -> None:
        self.refused += 1
        self._refuse(error)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        task.add_done_callback(retrieved)
        return task

    async def _send_controls(self) -> None:
        while self._control is not None:
            req, self._control = self._control, None
            await self._answered(self._hub.control.remote(self._world_id, self._viewer_id, req.keys, req.event_id),
                                 req.session_id)

    async def _answered(self, call, session_id: str) -> None:
        ended, result = await settle(call, HUB_TIMEOUT_S)
        if isinstance(result, ReplicaError):
            self._refused(ProtocolError(result.code, result.message, session_id))
        elif not ended or isinstance(result, BaseException):
            self._refuse(ProtocolError(ErrorCode.BUSY, "the world hub did not answer; send it again", session_id))
