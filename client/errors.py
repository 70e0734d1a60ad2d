"""The errors a client raises about the server: its `error` replies, a reply the client refuses,
and a server that does not answer in time."""
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


class BadReply(ServerError):
    """A reply this client refuses, with code `bad_message` (what the server answers a request it
    cannot take): not a reply of the protocol, over the frame size the handshake allows, for a
    session this connection did not open, a chunk id out of its session's sequence, a video
    that is not fMP4 fragments (or does not decode), or a reply of the wrong kind. Nothing of it
    is kept or written."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BAD_MESSAGE, message)


class ReplyTimeout(TimeoutError):
    """The server did not answer in time: `waited_s` seconds without the reply waited for;
    `in_line`: the session waited in the server's line (`queued` notices) past the line's own
    bound, else the server sent nothing for the reply timeout."""

    def __init__(self, message: str, waited_s: float, in_line: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.waited_s = waited_s
        self.in_line = in_line


def shown(value: object, limit: int = 40) -> str:
    """A value from the server, quoted on one line and cut to `limit` chars (messages name it)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def one_line(text: str, limit: int = 300) -> str:
    """A server's text on one line of at most `limit` chars (a hostile server's message may hold
    newlines, terminal escapes or megabytes)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text[:4 * limit]).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
