"""Admission (deployments/ingress/guards/admission.py): the one set of steps that lets a socket
in on every WebSocket route (camera, openpi, watch), on starlette's WebSocket over an in-process
ASGI exchange: the origin before the upgrade, the API key after it (`anonymous`: the watch
route's keyless viewers), the connection caps; each refusal a typed error, then the close."""
from __future__ import annotations

import asyncio
from typing import Optional

from starlette.websockets import WebSocket

from deployments.config import AuthArgs
from deployments.ingress.guards.admission import POLICY_VIOLATION, TRY_AGAIN_LATER, Admission, Admitted
from deployments.ingress.guards.auth import Auth
from deployments.ingress.guards.connection_caps import ConnectionCaps
from protocol import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

KEYS_ENV = "TEST_LWF_ADMISSION_KEYS"
RETRY_AFTER_S = 3.0


class Counted:
    """IngressMetrics' two counters that admission touches."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.errors: list[str] = []

    def refuse_connection(self, reason: str) -> None:
        self.refused.append(reason)

    def count_error(self, code: str) -> None:
        self.errors.append(code)


def socket(headers: dict[str, str], sent: list[dict], client: str = "10.0.0.1") -> WebSocket:
    scope = {"type": "websocket", "path": "/", "query_string": b"", "client": (client, 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    first = [{"type": "websocket.connect"}]

    async def receive() -> dict:
        return first.pop() if first else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict) -> None:
        sent.append(message)

    return WebSocket(scope, receive, send)


def admission(monkeypatch, per_client: int = 4) -> tuple[Admission, Counted]:
    monkeypatch.setenv(KEYS_ENV, "k1,k2")
    metrics = Counted()
    auth = Auth(AuthArgs(api_keys_env=KEYS_ENV, allowed_origins=["https://app.example"]))
    return Admission(auth, ConnectionCaps(8, per_client, None), metrics, False, RETRY_AFTER_S), metrics


def admit(gate: Admission, headers: dict[str, str], anonymous: bool = False,
          client: str = "10.0.0.1") -> tuple[Optional[Admitted], list[dict]]:
    sent: list[dict] = []
    admitted = asyncio.run(gate.admit(socket(headers, sent, client), anonymous=anonymous))
    return admitted, sent


def refusal(sent: list[dict]) -> tuple[ErrorReply, int, str]:
    """(the error sent after the accept, the close code, its reason)."""
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.close"], sent
    return decode_reply(sent[1]["bytes"]), sent[2]["code"], sent[2]["reason"]


def test_a_foreign_origin_is_closed_before_the_upgrade_on_every_route(monkeypatch):
    gate, metrics = admission(monkeypatch)
    for anonymous in (False, True):  # the camera route, the watch route with keyless viewers on
        admitted, sent = admit(gate, {"Origin": "https://evil.example", "Authorization": "Bearer k1"}, anonymous)
        assert admitted is None
        assert sent == [{"type": "websocket.close", "code": POLICY_VIOLATION, "reason": "origin not allowed"}]
    assert metrics.refused == ["origin", "origin"]


def test_a_wrong_key_is_unauthorized_even_where_keyless_viewers_may_watch(monkeypatch):
    gate, metrics = admission(monkeypatch)
    answers = []
    for anonymous in (False, True):
        admitted, sent = admit(gate, {"Authorization": "Bearer k3"}, anonymous)
        assert admitted is None
        reply, code, reason = refusal(sent)
        answers.append((type(reply), reply.code, reply.message, code, reason))
    assert answers[0] == answers[1] and answers[0][1:2] == (ErrorCode.UNAUTHORIZED,)
    assert answers[0][3:] == (POLICY_VIOLATION, "unauthorized")
    assert metrics.refused == ["unauthorized"] * 2 and metrics.errors == ["unauthorized"] * 2


def test_no_key_is_let_in_as_its_address_only_where_anonymous(monkeypatch):
    gate, _ = admission(monkeypatch)
    refused, sent = admit(gate, {})
    assert refused is None and refusal(sent)[0].code is ErrorCode.UNAUTHORIZED
    admitted, sent = admit(gate, {}, anonymous=True)
    assert admitted == Admitted(None, "10.0.0.1") and [m["type"] for m in sent] == ["websocket.accept"]
    keyed, _ = admit(gate, {"Authorization": "Bearer k2"}, anonymous=True)
    assert keyed == Admitted("key1", "10.0.0.1")


def test_a_capped_address_gets_busy_with_a_retry_hint_until_one_is_released(monkeypatch):
    gate, metrics = admission(monkeypatch, per_client=1)
    first, _ = admit(gate, {"Authorization": "Bearer k1"})
    assert first == Admitted("key0", "10.0.0.1")
    refused, sent = admit(gate, {"Authorization": "Bearer k2"})
    reply, code, reason = refusal(sent)
    assert refused is None and reply.code is ErrorCode.BUSY and reply.retry_after_s == RETRY_AFTER_S
    assert (code, reason) == (TRY_AGAIN_LATER, "client_cap") and metrics.refused == ["client_cap"]
    gate.release(first)
    again, _ = admit(gate, {"Authorization": "Bearer k2"})
    assert again == Admitted("key1", "10.0.0.1")
