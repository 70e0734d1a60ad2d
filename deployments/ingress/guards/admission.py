"""Admission: the steps that let a WebSocket in, one function for every socket route (the camera
and openpi routes, server.py; the watch route, sharing/viewer.py), so that a change of them
reaches every route.

In order: the origin (`Auth.origin_allowed`; refused before the upgrade: HTTP 403), the accept
(echoing the bearer subprotocol a browser offered), the API key (`Auth.authenticate`; refused
with an `unauthorized` error, then close 1008 "unauthorized"), the connection caps per address
and per key (`ConnectionCaps.admit`; refused with a `busy` error carrying `retry_after_s`, then
close 1013 with the cap's reason). Each refusal is counted (`refuse_connection`, and the error's
code). An admitted socket holds its place in the caps until `release`. `anonymous` (the watch
route with `sharing.anonymous_viewers`): a socket that presents no key at all is let in without
one (key id None: its address is its principal); a wrong key is still refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fastapi import WebSocket

from deployments.ingress.guards.auth import UNAUTHORIZED_MESSAGE, Auth, bearer_subprotocol, presented_key
from deployments.ingress.guards.connection_caps import ConnectionCaps, client_address
from deployments.metrics import IngressMetrics
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013  # WebSocket close code: the server is at a connection cap


@dataclass(frozen=True, slots=True)
class Admitted:
    """Who an admitted socket is: its API key id (None: auth off) and its address."""

    key_id: Optional[str]
    client: str


class Admission:
    """Admits the sockets of one ingress replica (module doc)."""

    def __init__(self, auth: Auth, caps: ConnectionCaps, metrics: IngressMetrics, trust_forwarded_for: bool,
                 retry_after_s: float) -> None:
        self._auth = auth
        self._caps = caps
        self._metrics = metrics
        self._trust_forwarded_for = trust_forwarded_for
        self._retry_after_s = retry_after_s

    async def admit(self, ws: WebSocket, anonymous: bool = False) -> Optional[Admitted]:
        """The socket accepted and counted in the caps, or None: refused and closed."""
        if not self._auth.origin_allowed(ws):
            self._metrics.refuse_connection("origin")
            await ws.close(code=POLICY_VIOLATION, reason="origin not allowed")  # before accept: HTTP 403
            return None
        subprotocol = bearer_subprotocol(ws)  # a browser that offered one fails unless it is echoed
        await (ws.accept(subprotocol=subprotocol) if subprotocol else ws.accept())
        accepted, key_id = self._auth.authenticate(ws)
        if not accepted and anonymous and not presented_key(ws):
            accepted = True  # no key at all: its address is its principal (share_args.py)
        if not accepted:
            self._metrics.count_error(ErrorCode.UNAUTHORIZED.value)
            self._metrics.refuse_connection("unauthorized")
            await ws.send_bytes(encode(ErrorReply(code=ErrorCode.UNAUTHORIZED, message=UNAUTHORIZED_MESSAGE)))
            await ws.close(code=POLICY_VIOLATION, reason="unauthorized")
            return None
        client = client_address(ws, self._trust_forwarded_for)
        refusal = self._caps.admit(client, key_id)
        if refusal is not None:
            reason, message = refusal
            self._metrics.count_error(ErrorCode.BUSY.value)
            self._metrics.refuse_connection(reason)
            await ws.send_bytes(encode(ErrorReply(code=ErrorCode.BUSY, message=message,
                                                  retry_after_s=self._retry_after_s)))
            await ws.close(code=TRY_AGAIN_LATER, reason=reason)
            return None
        return Admitted(key_id, client)

    def release(self, admitted: Admitted) -> None:
        """The socket's end: its place in the caps is free again."""
        self._caps.release(admitted.client, admitted.key_id)
