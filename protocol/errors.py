"""Error codes of the wire contract and the one exception the codec raises."""
from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """The `code` of an `error` reply (PROTOCOL.md §3)."""

    BAD_MESSAGE = "bad_message"  # not msgpack, not a map, unknown endpoint, wrong field type
    MISSING_FIELD = "missing_field"  # a required field is absent
    BAD_CAMERAS = "bad_cameras"  # shapes, N = 0, non-finite, non-rigid pose, focal <= 0
    BAD_IMAGE = "bad_image"  # undecodable, too many pixels, too small
    TOO_LARGE = "too_large"  # message or field over its limit
    SESSION_LOST = "session_lost"  # the server no longer holds the session's state
    BUSY = "busy"  # no capacity for a new session now (see retry_after_s)
    UNAUTHORIZED = "unauthorized"  # missing or wrong credentials
    SESSION_LIMIT = "session_limit"  # the session reached its chunk limit (RoPE table: 1024 latent frames, or its num_frames)
    YIELDED = "yielded"  # a notice: the session gave its place to those waiting (idle); its next infer waits in line
    FORBIDDEN = "forbidden"  # the socket's role in a shared world does not allow the request (a viewer's infer)
    STORE_BEHIND = "store_behind"  # a notice: the world store does not keep up; chunks wait in memory (none lost)
    WORLD_NOT_FOUND = "world_not_found"  # no such world of the caller's (another's answers the same)
    WORLD_QUOTA = "world_quota"  # the caller's worlds would pass worlds.quota_mib
    STORE_UNAVAILABLE = "store_unavailable"  # the world store did not answer; nothing was saved or opened
    WORLD_CHANGED = "world_changed"  # a session kept in the world store was made by a model this server does not serve


class ProtocolError(ValueError):
    """A client message that the server rejects; becomes an `error` reply.

    `message` says what to fix. It never quotes the offending input, so building it
    cannot fail on hostile values.
    """

    def __init__(self, code: ErrorCode, message: str, session_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.session_id = session_id  # of the refused request, when it carried a valid one
