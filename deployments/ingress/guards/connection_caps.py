"""ConnectionCaps: how many WebSockets one ingress replica holds, in all, per client address
and per API key (AppArgs.connection, auth.max_connections_per_key).

Each open WebSocket is one ongoing request of the ingress replica for its whole life; without
caps, a few dozen idle sockets of one client fill `max_ongoing_requests` and then health checks
and every other client time out. The caps answer `busy` at the handshake instead, and keep a few slots for addresses that hold
no socket, so that a few addresses with many sockets cannot lock new clients out.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

from starlette.requests import HTTPConnection

UNKNOWN_CLIENT = "unknown"


class ConnectionCaps:
    """Counts open connections; `admit` refuses one beyond a cap (reason, message)."""

    def __init__(self, total: int, per_client: int, per_key: Optional[int], reserved_for_new: int = 0) -> None:
        """`reserved_for_new`: of the `total` slots, how many only an address holding no
        connection may take (at most total - 1)."""
        self._total = total
        self._reserved = min(reserved_for_new, total - 1)
        self._per_client = per_client
        self._per_key = per_key
        self._clients: Counter[str] = Counter()
        self._keys: Counter[str] = Counter()
        self.open = 0

    def admit(self, client: str, key_id: Optional[str]) -> Optional[tuple[str, str]]:
        """Count a new connection; (reason, message) when a cap refuses it (nothing counted)."""
        if self.open >= self._total or (self._clients[client] and self.open >= self._total - self._reserved):
            return "server_full", (f"this server replica holds {self.open} connections, the most it may; "
                                   "retry later")
        if self._clients[client] >= self._per_client:
            return "client_cap", (f"this client address holds {self._clients[client]} connections, the most "
                                  "it may; close one first")
        if key_id is not None and self._per_key is not None and self._keys[key_id] >= self._per_key:
            return "key_cap", (f"this API key holds {self._keys[key_id]} connections, the most it may; "
                               "close one first")
        self.open += 1
        self._clients[client] += 1
        if key_id is not None:
            self._keys[key_id] += 1
        return None

    def release(self, client: str, key_id: Optional[str]) -> None:
        self.open -= 1
        _decrement(self._clients, client)
        if key_id is not None:
            _decrement(self._keys, key_id)


def _decrement(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


def client_address(conn: HTTPConnection, trust_forwarded_for: bool) -> str:
    """The client's address: when trusted, the last X-Forwarded-For entry (the one the trusted
    proxy in front appended: the address that connected to it; earlier entries come from the
    client and can be forged), else the peer's."""
    if trust_forwarded_for:
        forwarded = conn.headers.get("x-forwarded-for", "").split(",")[-1].strip()
        if forwarded:
            return forwarded
    return conn.client.host if conn.client is not None else UNKNOWN_CLIENT
