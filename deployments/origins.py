"""Web origins: the canonical form of an `auth.allowed_origins` entry, and whether a browser's
`Origin` header names the server's own origin.

An origin is `scheme://host[:port]` (RFC 6454), as browsers send it in `Origin`: http or https,
no path, no user. Compared as (scheme, host, port), host in lower case, the scheme's default
port filled in, so `https://App.example:443` and `https://app.example` are one origin.

The server's own origin is the one whose host and port equal the request's `Host` header (a
Host without a port has the Origin scheme's default port). The scheme is not compared: behind a
TLS proxy the server sees `http` for a page at `https://`, and the Host it receives is the one
the browser sent (ingress-nginx and Serve's proxy keep it). A proxy that rewrites Host makes
the page another origin: list it.
"""
from __future__ import annotations

import re
from typing import Optional

ANY_ORIGIN = "*"  # an allow-list entry: every origin
DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = r"(\[[0-9a-f:.]+\]|[^\s/?#@:\[\]\\]+)(?::(\d{1,5}))?"
_ORIGIN = re.compile(rf"(https?)://{_HOST}", re.IGNORECASE)
_HOST_HEADER = re.compile(_HOST, re.IGNORECASE)

Origin = tuple[str, str, int]  # (scheme, host, port)


def origin_parts(text: str) -> Optional[Origin]:
    """(scheme, host, port) of a serialized origin, lower case, the default port filled in;
    None when `text` is not one (`null`, a path, a user, another scheme, a port over 65535)."""
    m = _ORIGIN.fullmatch(text.strip())
    if m is None:
        return None
    scheme, host = m[1].lower(), m[2].lower()
    port = DEFAULT_PORTS[scheme] if m[3] is None else int(m[3])
    return (scheme, host, port) if 0 < port < 65536 else None


def canonical_origin(entry: str) -> str:
    """An allow-list entry as browsers write it (`*` stays `*`); ValueError when it is not an origin."""
    if entry.strip() == ANY_ORIGIN:
        return ANY_ORIGIN
    parts = origin_parts(entry)
    if parts is None:
        raise ValueError(f"{entry!r} is not an origin: write scheme://host[:port] as browsers send it in "
                         f"`Origin` (http or https, no path nor trailing slash: 'https://app.example', "
                         f"'http://127.0.0.1:9000'), or '*' for any origin")
    scheme, host, port = parts
    return f"{scheme}://{host}" + ("" if port == DEFAULT_PORTS[scheme] else f":{port}")


def is_own_origin(origin: Origin, host_header: str) -> bool:
    """Whether `origin` has the host and port of the request's `Host` header."""
    m = _HOST_HEADER.fullmatch(host_header.strip())
    if m is None:
        return False
    port = DEFAULT_PORTS[origin[0]] if m[2] is None else int(m[2])
    return (m[1].lower(), port) == origin[1:]
