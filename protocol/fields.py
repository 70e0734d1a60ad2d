"""Field types and the message base shared by the wire's requests (protocol/messages.py) and
replies (protocol/replies.py): arrays as msgpack-numpy maps, images, resume tokens; `_Request`,
whose `session_id` every request has, and the prompt's length check."""
from __future__ import annotations

import re

from typing import Annotated, Union

import numpy as np
from pydantic import (BaseModel, ConfigDict, Field, PlainSerializer, Strict, ValidationInfo, WithJsonSchema,
                      field_validator)

from camera.frames import MAX_CHUNKS
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits

_SIZE = re.compile(r"([0-9]{1,5})\*([0-9]{1,5})")  # used with fullmatch

StrictInt = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
_BINARY = {"type": "string", "format": "binary", "description": "msgpack bin"}
_WIRE_ARRAY = ("msgpack-numpy map (nd, type, kind, shape, data), openpi `__ndarray__` map, "
               "or nested lists of numbers")


def _tolist(a: bytes | np.ndarray) -> bytes | list:
    """JSON view of an array field (bytes stay bytes: base64 in JSON mode)."""
    return a.tolist() if isinstance(a, np.ndarray) else a


def _array_schema(shape: str, inner: dict) -> WithJsonSchema:
    return WithJsonSchema({"type": "array", "minItems": 1, "items": inner,
                           "description": f"float32 {shape}; on the wire a {_WIRE_ARRAY}"})


_ROW4 = {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4}
IntrinsicsArray = Annotated[np.ndarray, PlainSerializer(_tolist, when_used="json"),
                            _array_schema("[N, 4] (fx, fy, cx, cy)", _ROW4)]
PosesArray = Annotated[np.ndarray, PlainSerializer(_tolist, when_used="json"),
                       _array_schema("[N, 4, 4] OpenCV camera-to-world",
                                     {"type": "array", "items": _ROW4, "minItems": 4, "maxItems": 4})]
ImageField = Annotated[Union[bytes, np.ndarray], PlainSerializer(_tolist, when_used="json"),
                       WithJsonSchema({"anyOf": [
                           {**_BINARY, "description": "PNG or JPEG file bytes (msgpack bin)"},
                           {"type": "array", "description": f"raw RGB uint8 [H, W, 3]; a {_WIRE_ARRAY}"}]})]
Bin = Annotated[bytes, WithJsonSchema(_BINARY)]


MAX_RESUME_TOKEN_CHARS = 128
ResumeToken = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_RESUME_TOKEN_CHARS)]
ResumeFrom = Annotated[int, Strict(), Field(ge=0, le=MAX_CHUNKS)]
_RESUME_TOKEN_DOC = ("the `resume_token` of the session's first frame reply: continues the session on this "
                     "connection after its socket dropped (within the handshake's `resume_grace_s`)")
_RESUME_FROM_DOC = ("with `resume_token`: the chunk replies of the session the client already has (the next "
                    "chunk_id it expects); the server sends the later ones again. Absent: the ones it had not sent")


def _limits(info: ValidationInfo) -> Limits:
    return (info.context or {}).get("limits", DEFAULT_LIMITS)


class _Message(BaseModel):
    # JSON mode (logs, docs) writes bytes as base64; the wire itself is msgpack with bin.
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="ignore", ser_json_bytes="base64")


class _Request(_Message):
    session_id: Annotated[str, Strict()] = Field(description="non-empty; at most 128 chars by default")

    @field_validator("session_id")
    @classmethod
    def _session_id(cls, v: str, info: ValidationInfo) -> str:
        limit = _limits(info).max_session_id_chars
        name = info.field_name or "session_id"
        if not v:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{name}` must be a non-empty string")
        if len(v) > limit:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"`{name}` has {len(v)} chars; at most {limit}")
        return v


def _check_prompt(v: str | None, info: ValidationInfo) -> str | None:
    limit = _limits(info).max_prompt_chars
    if v is not None and len(v) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{info.field_name}` has {len(v)} chars; at most {limit}")
    return v
