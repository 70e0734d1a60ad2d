"""HTTP answers of `/v1/videos`: the wire's error codes as statuses, bodies shaped like `error`."""
from __future__ import annotations

from typing import Any, Optional

from fastapi.responses import JSONResponse

from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

HTTP_STATUS = {
    ErrorCode.BAD_MESSAGE: 400, ErrorCode.MISSING_FIELD: 400, ErrorCode.BAD_CAMERAS: 400,
    ErrorCode.BAD_IMAGE: 400, ErrorCode.TOO_LARGE: 413, ErrorCode.SESSION_LOST: 503,
    ErrorCode.BUSY: 503, ErrorCode.UNAUTHORIZED: 401, ErrorCode.SESSION_LIMIT: 413,
}


class HttpError(Exception):
    """A failed request: HTTP status and a JSON body `{"type": "error", "code", "message"}`
    (plus `retry_after_s` and a `Retry-After` header for `busy`)."""

    def __init__(self, status: int, body: dict[str, Any], retry_after_s: Optional[float] = None) -> None:
        super().__init__(f"{status} {body}")
        self.status, self.body, self.retry_after_s = status, body, retry_after_s

    @classmethod
    def of(cls, code: ErrorCode, message: str, retry_after_s: Optional[float] = None) -> HttpError:
        """The answer for a wire error code, with the body of the wire's `error` reply."""
        retry = retry_after_s if code is ErrorCode.BUSY else None
        reply = ErrorReply(code=code, message=message, retry_after_s=retry)
        return cls(HTTP_STATUS[code], reply.model_dump(mode="json", exclude_none=True), retry)

    @classmethod
    def other(cls, status: int, code: str, message: str) -> HttpError:
        """An answer with no wire code (`not_found`, `not_ready`, `forbidden`, `unsupported_media_type`, `internal`)."""
        return cls(status, {"type": "error", "code": code, "message": message})

    def response(self) -> JSONResponse:
        headers = None if self.retry_after_s is None else {"Retry-After": str(max(1, round(self.retry_after_s)))}
        return JSONResponse(self.body, self.status, headers=headers)
