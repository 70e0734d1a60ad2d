"""Optional API keys and origin allow-list for the WebSocket (AppArgs.auth).

Keys come from the environment variable named by `api_keys_env` (comma separated, a secret
in Kubernetes). A client presents one as `Authorization: Bearer <key>` or, where it cannot
set headers (browsers), as the `api_key` query parameter.
"""
from __future__ import annotations

import hmac
import os

from starlette.requests import HTTPConnection

from deployments.config import AuthArgs


class Auth:
    """Checks one connection against the configured keys and origins."""

    def __init__(self, args: AuthArgs) -> None:
        self._origins = frozenset(args.allowed_origins)
        self._keys: tuple[str, ...] = ()
        if args.api_keys_env is not None:
            raw = os.environ.get(args.api_keys_env, "")
            self._keys = tuple(k.strip() for k in raw.split(",") if k.strip())
            if not self._keys:
                raise ValueError(f"auth.api_keys_env is {args.api_keys_env!r} but that environment variable "
                                 "holds no keys; set it (comma separated) or leave api_keys_env null")

    def origin_allowed(self, conn: HTTPConnection) -> bool:
        origin = conn.headers.get("origin")
        return not self._origins or origin is None or origin in self._origins

    def key_accepted(self, conn: HTTPConnection) -> bool:
        if not self._keys:
            return True
        header = conn.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else conn.query_params.get("api_key", "")
        return any(hmac.compare_digest(given.encode(), k.encode()) for k in self._keys)
