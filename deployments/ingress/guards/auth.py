"""Optional API keys and the origin check for the WebSocket and `/v1/videos` (AppArgs.auth).

Origins: a browser sends the page's `Origin`; only the server's own (the request's Host,
deployments/origins.py) and those `allowed_origins` lists pass (`*`: any). A client that sends
no `Origin` is not a browser page and passes (programs, curl, lwf-client).

Keys come from the environment variable named by `api_keys_env` (comma separated, a secret
in Kubernetes), never from the repository or the serve config. A client presents one as

* `Authorization: Bearer <key>` (programs), or `Authorization: Api-Key <key>` (the scheme
  openpi's `WebsocketClientPolicy(api_key=...)` sends), or
* the WebSocket subprotocol `lwf.bearer.<key>` (browsers cannot set headers on a WebSocket:
  `new WebSocket(url, ["lwf.bearer." + key])`, what web/stream.js does); the server accepts
  the socket with that subprotocol, as browsers require when they offered one, or
* the `api_key` query parameter: deprecated (URLs end up in logs and browser history; the
  web page no longer sends it), kept for older web clients and `/docs` in a browser.

Keys are compared in constant time (`hmac.compare_digest`, against every key). A connection is
identified to the quotas and logs by the key's position (`key0`, `key1`, ...), not the key.
"""
from __future__ import annotations

import hmac
import os
from typing import Optional

from starlette.requests import HTTPConnection

from deployments.config import AuthArgs
from deployments.origins import ANY_ORIGIN, is_own_origin, origin_parts

BEARER_SUBPROTOCOL = "lwf.bearer."
ANONYMOUS = None  # the key id of connections when auth is off
AUTH_SCHEMES = ("bearer ", "api-key ")  # `Authorization` schemes, lower case with their space
UNAUTHORIZED_MESSAGE = ("missing or wrong API key: send `Authorization: Bearer <key>` (or `Api-Key <key>`) "
                        "or, from a browser, the WebSocket subprotocol `lwf.bearer.<key>`")


def offered_subprotocols(conn: HTTPConnection) -> list[str]:
    """The subprotocols the client offered (`Sec-WebSocket-Protocol`, comma separated)."""
    return [p.strip() for p in conn.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def bearer_subprotocol(conn: HTTPConnection) -> Optional[str]:
    """The first offered `lwf.bearer.<key>` subprotocol (to echo when accepting), if any."""
    return next((p for p in offered_subprotocols(conn) if p.startswith(BEARER_SUBPROTOCOL)), None)


class Auth:
    """Checks one connection against the configured keys and origins."""

    def __init__(self, args: AuthArgs) -> None:
        self._any_origin = ANY_ORIGIN in args.allowed_origins
        self._origins = frozenset(origin_parts(o) for o in args.allowed_origins if o != ANY_ORIGIN)
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
        """No `Origin` (not a browser), the server's own origin, or one the allow-list names."""
        origin = conn.headers.get("origin")
        if origin is None or self._any_origin:
            return True
        parts = origin_parts(origin)  # None for `null` (sandboxed frames, file:// pages) and junk
        return parts is not None and (parts in self._origins or is_own_origin(parts, conn.headers.get("host", "")))

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
