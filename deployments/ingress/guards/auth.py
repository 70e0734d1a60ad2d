"""Optional API keys and origin allow-list for the WebSocket (AppArgs.auth).

Keys come from the environment variable named by `api_keys_env` (comma separated, a secret
in Kubernetes), never from the repository or the serve config. A client presents one as

* `Authorization: Bearer <key>` (programs), or `Authorization: Api-Key <key>` (the scheme
  openpi's `WebsocketClientPolicy(api_key=...)` sends), or
* the WebSocket subprotocol `lwf.bearer.<key>` (browsers cannot set headers:
  `new WebSocket(url, ["lwf.bearer." + key])`); the server accepts the socket with that
  subprotocol, as browsers require when they offered one, or
* the `api_key` query parameter (kept for older web clients; URLs end up in logs, prefer
  the subprotocol).

Keys are compared in constant time (`hmac.compare_digest`, against every key). A connection is
identified to the quotas and logs by the key's position (`key0`, `key1`, ...), not the key.
"""
from __future__ import annotations

import hmac
import os
from typing import Optional

from starlette.requests import HTTPConnection

from deployments.config import AuthArgs

BEARER_SUBPROTOCOL = "lwf.bearer."
ANONYMOUS = None  # the key id of connections when auth is off
AUTH_SCHEMES = ("bearer ", "api-key ")  # `Authorization` schemes, lower case with their space
UNAUTHORIZED_MESSAGE = ("missing or wrong API key: send `Authorization: Bearer <key>` (or `Api-Key <key>`), "
                        "the WebSocket subprotocol "
                        "`lwf.bearer.<key>` or the `api_key` query parameter")


def offered_subprotocols(conn: HTTPConnection) -> list[str]:
    """The subprotocols the client offered (`Sec-WebSocket-Protocol`, comma separated)."""
    return [p.strip() for p in conn.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def bearer_subprotocol(conn: HTTPConnection) -> Optional[str]:
    """The first offered `lwf.bearer.<key>` subprotocol (to echo when accepting), if any."""
    return next((p for p in offered_subprotocols(conn) if p.startswith(BEARER_SUBPROTOCOL)), None)


class Auth:
    """Checks one connection against the configured keys and origins."""

    def __init__(self, args: AuthArgs) -> None:
        self._origins = frozenset(args.allowed_origins)
        self._keys: tuple[bytes, ...] = ()
        if args.api_keys_env is not None:
            raw = os.environ.get(args.api_keys_env, "")
            self._keys = tuple(k.strip().encode() for k in raw.split(",") if k.strip())
            if not self._keys:
                raise ValueError(f"auth.api_keys_env is {args.api_keys_env!r} but that environment variable "
                                 "holds no keys; set it (comma separated) or leave api_keys_env null")

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def origin_allowed(self, conn: HTTPConnection) -> bool:
        origin = conn.headers.get("origin")
        return not self._origins or origin is None or origin in self._origins

    def authenticate(self, conn: HTTPConnection) -> tuple[bool, Optional[str]]:
        """(accepted, key id): the id of the presented key, None when auth is off."""
        if not self._keys:
            return True, ANONYMOUS
        given = presented_key(conn).encode()
        matches = [hmac.compare_digest(given, k) for k in self._keys]  # every key: no early exit
        if not any(matches):
            return False, None
        return True, f"key{matches.index(True)}"


def presented_key(conn: HTTPConnection) -> str:
    """The key the client presented: Bearer (or Api-Key) header, else bearer subprotocol, else query parameter."""
    header = conn.headers.get("authorization", "")
    for scheme in AUTH_SCHEMES:
        if header[:len(scheme)].lower() == scheme:
            return header[len(scheme):].strip()
    sub = bearer_subprotocol(conn)
    if sub is not None:
        return sub[len(BEARER_SUBPROTOCOL):]
    return conn.query_params.get("api_key", "")
