"""Ids and keys of the world store: what may name an object, and where a principal's worlds live.

A key is `/`-separated segments of `[A-Za-z0-9_-]` plus inner dots (no empty segment, no `.` or
`..`, no leading `/` or `.`): nothing a backend could read as a path outside its root, and no
name of the local backend's temporary files (`.tmp-*`). A principal's worlds live under
`p/<sha256 of the principal, 32 hex digits>/`: the store never holds an API key or an address,
and a principal's listing is its own prefix, so it cannot name another's worlds.
"""
from __future__ import annotations

import hashlib
import re
import secrets

from deployments.worlds.errors import BadWorldKey

SEGMENT = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_-])?")
WORLD_ID = re.compile(r"w[0-9a-f]{24}")  # `new_world_id`'s form: the only ids the store accepts
MAX_KEY_CHARS = 1024


def check_key(key: str) -> str:
    """`key` if it is a valid store key, else BadWorldKey."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
        raise BadWorldKey("a store key is 1 to 1024 characters")
    for segment in key.split("/"):
        if not SEGMENT.fullmatch(segment) or ".." in segment:
            raise BadWorldKey("a store key is '/'-separated segments of letters, digits, '_', '-' and inner dots")
    return key


def check_prefix(prefix: str) -> str:
    """A key prefix (a store's `prefix`, a listing's): "" or a valid key."""
    return prefix if prefix == "" else check_key(prefix[:-1] if prefix.endswith("/") else prefix)


def join(*parts: str) -> str:
    """Segments joined into one checked key (empty parts skipped)."""
    return check_key("/".join(p.strip("/") for p in parts if p))


def principal_dir(principal: str) -> str:
    """Where a principal's worlds live: its digest, never its name."""
    if not isinstance(principal, str) or not principal:
        raise BadWorldKey("a world's owner is a non-empty principal")
    return "p/" + hashlib.sha256(principal.encode()).hexdigest()[:32]


def check_world_id(world_id: str) -> str:
    """`world_id` if it has the server's form (`w` + 24 hex digits), else BadWorldKey."""
    if not isinstance(world_id, str) or not WORLD_ID.fullmatch(world_id):
        raise BadWorldKey("a world id is 'w' followed by 24 lowercase hex digits")
    return world_id


def new_world_id() -> str:
    """A fresh world id (96 random bits: not guessable, so an id alone is no right to a world)."""
    return "w" + secrets.token_hex(12)


def world_dir(principal: str, world_id: str) -> str:
    return f"{principal_dir(principal)}/w/{check_world_id(world_id)}"
