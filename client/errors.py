"""The error a client raises for an `error` reply of the server."""
from __future__ import annotations

from typing import Optional

from protocol.errors import ErrorCode
from protocol.messages import ErrorReply


class ServerError(RuntimeError):
    """An `error` reply (or a refused handshake), with its wire code."""

    def __init__(self, code: ErrorCode | str, message: str, retry_after_s: Optional[float] = None) -> None:
        self.code = ErrorCode(code)
        self.message = message
        self.retry_after_s = retry_after_s
        super().__init__(f"[{self.code.value}] {message}")

    @classmethod
    def from_reply(cls, reply: ErrorReply) -> ServerError:
        return cls(reply.code, reply.message, reply.retry_after_s)
