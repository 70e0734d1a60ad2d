"""Typed errors of the world store. Each has a `code` (what a caller answers with) and a message
that never quotes the offending input (a hostile id or file cannot make building it fail)."""
from __future__ import annotations


class WorldError(Exception):
    """Base of the store's errors."""

    code = "world_error"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")
        self.message = message


class BadWorldKey(WorldError):
    """An id or key that is not of the store's alphabet (path traversal, absolute, odd characters)."""

    code = "bad_world_id"


class WorldNotFound(WorldError):
    """No such object or world (for this principal: another's world is not found, never refused)."""

    code = "world_not_found"


class StoreUnavailable(WorldError):
    """The backend failed or did not answer (down, slow, denied): nothing was written or read."""

    code = "store_unavailable"


class QuotaExceeded(WorldError):
    """The principal's worlds would exceed `worlds.quota_mib` with this write: nothing was written."""

    code = "world_quota"


class BadWorldFile(WorldError):
    """An imported `.lwf` file that is corrupt, truncated, oversized or not one: nothing was loaded."""

    code = "bad_world_file"


class WriterFull(WorldError):
    """The write-behind queue is at its bound: the chunk was not accepted (the caller still holds it)."""

    code = "store_behind"
