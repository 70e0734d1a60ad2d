"""msgpack frames <-> validated messages.

`decode` is the server's intake: it never raises anything but `ProtocolError(code, message)`.
`encode` packs any message (replies, and requests on the client side) as one msgpack map,
numpy arrays as msgpack-numpy maps and bytes as msgpack bin: it takes models only (the client
builds them, protocol/requests.py; `validated` checks one as the server would).
"""
from __future__ import annotations

import re
from typing import Optional, TypeVar

import msgpack
import msgpack_numpy
import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import REQUEST_TYPES, Reply, Request

_FIELD_CODES = {"cameras": ErrorCode.BAD_CAMERAS, "image": ErrorCode.BAD_IMAGE}
_REPLY = TypeAdapter(Reply)
M = TypeVar("M", bound=BaseModel)


class _ElementBudget:
    """msgpack `list_hook`: counts the elements of every array unpacked from one frame and
    stops at `limit`, so that a frame of small numbers cannot become a huge Python list (a
    16 MiB frame holds 16 M one-byte integers: over 128 MB of list)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, items: list) -> list:
        self.left -= len(items)
        if self.left < 0:
            raise ProtocolError(ErrorCode.TOO_LARGE, "the message holds too many array elements; send "
                                                     "large arrays as msgpack-numpy or openpi binary maps")
        return items


_SCALAR_KINDS = "biuf"  # bool, int, uint, float: what an openpi scalar may be


def _scalar_hook(m: dict) -> object:
    """msgpack `object_hook`: an openpi NumPy scalar map (`{__npgeneric__: True, data, dtype}`,
    what openpi's msgpack_numpy writes for e.g. `np.int64(7)`) -> the plain Python scalar, so
    that a NumPy seed validates like an int. Every other map is returned as it is."""
    flag = m.get("__npgeneric__", m.get(b"__npgeneric__"))
    if flag is not True:
        return m
    dtype, value = m.get("dtype", m.get(b"dtype")), m.get("data", m.get(b"data"))
    if isinstance(dtype, bytes):
        dtype = dtype.decode("ascii", "replace")
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in _SCALAR_KINDS or isinstance(value, (bytes, str, list, dict)) or value is None:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "an openpi `__npgeneric__` scalar must be a bool, integer or "
                                                   "float with a NumPy dtype string (e.g. '<i8')")
    try:
        return dt.type(value).item()
    except (OverflowError, ValueError, TypeError):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"an openpi `__npgeneric__` scalar {value!r} does not fit "
                                                   f"its dtype {dt.str}") from None


def _unpack(data: bytes, *, max_bytes: int, max_str_len: int, max_map_len: int,
            max_array_len: int = 1 << 31, max_elements: int = 1 << 62) -> object:
    if not isinstance(data, bytes):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a message must be a binary frame holding one msgpack map")
    if len(data) > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message is {len(data)} bytes; at most {max_bytes}")
    try:
        # Declared lengths are bounded by these limits and by len(data) (msgpack's default for
        # arrays and bins; strings and bins are only read once their bytes are there), so a short
        # frame cannot make the unpacker allocate for a huge array, map or string.
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=max_str_len,
                               max_map_len=max_map_len, max_array_len=min(max_array_len, len(data)),
                               max_ext_len=0, list_hook=_ElementBudget(max_elements),
                               object_hook=_scalar_hook)
    except ProtocolError:  # from the list hook (a ValueError too)
        raise
    except msgpack.StackError:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message is nested too deeply to be a protocol message") from None
    except ValueError as e:
        # msgpack reports malformed input, exceeded limits and invalid UTF-8 as ValueError; only
        # the text tells our limits apart ("N exceeds max_str_len(M)"). A declared length beyond
        # the frame itself (array longer than len(data), truncated string) is a malformed frame.
        text = str(e)
        declared = re.match(r"(\d+) exceeds max_array_len", text)
        if declared and int(declared.group(1)) > len(data):  # more elements than the frame has bytes
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "message is not one valid msgpack value (an array "
                                                       "longer than the frame)") from None
        if any(f"exceeds max_{kind}_len" in text for kind in ("str", "map", "array")):
            raise ProtocolError(ErrorCode.TOO_LARGE, f"a string or map is over its limit ({text})") from None
        if "exceeds max_ext_len" in text:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "msgpack extension types are not in the protocol") from None
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message is not one valid msgpack value (truncated, "
                                                   "lengths beyond the frame, bad UTF-8, trailing bytes)") from None


def _protocol_error(err: ValidationError) -> ProtocolError:
    """Map the first validation failure to its error code."""
    first = err.errors(include_url=False, include_input=False)[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, ProtocolError):
        return cause
    loc = first["loc"]
    field = ".".join(str(p) for p in loc) or "message"
    if first["type"] == "missing" and isinstance(loc[-1], str):  # an int loc is a short tuple, not a field
        return ProtocolError(ErrorCode.MISSING_FIELD, f"`{field}` is required")
    code = _FIELD_CODES.get(loc[0], ErrorCode.BAD_MESSAGE) if loc else ErrorCode.BAD_MESSAGE
    return ProtocolError(code, f"`{field}`: {first['msg']}")


def _request_fields(obj: object) -> tuple[type[Request], dict]:
    """Apply the compatibility leniencies; pick the request type by `endpoint`."""
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a message must be a msgpack map")
    if not all(isinstance(k, str) for k in obj):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message keys must be strings")
    endpoint = obj.get("endpoint", "infer")  # vllm-omni clients send no endpoint
    model = REQUEST_TYPES.get(endpoint) if isinstance(endpoint, str) else None
    if model is None:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`endpoint` must be one of {sorted(REQUEST_TYPES)}")
    fields = dict(obj)
    if "camera" in fields:  # vllm-omni alias
        if "cameras" in fields:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "send `cameras` or its alias `camera`, not both")
        fields["cameras"] = fields.pop("camera")
    return model, fields


def unpack(data: bytes, limits: Limits = DEFAULT_LIMITS) -> object:
    """One client frame -> its msgpack value, under the same bounds as `decode` (openpi scalars
    already plain); raises only ProtocolError. For adapters that read other request shapes."""
    return _unpack(data, max_bytes=limits.max_message_bytes, max_map_len=limits.max_map_len,
                   max_str_len=4 * max(limits.max_prompt_chars, limits.max_session_id_chars),  # UTF-8 <= 4 B/char
                   max_array_len=limits.max_array_len, max_elements=limits.max_array_elements)


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Request:
    """One client frame -> InferRequest | ResetRequest | ResumeRequest | ForkRequest | RewindRequest |
    ControlRequest | DriveRequest | AckRequest; raises only ProtocolError."""
    obj = unpack(data, limits)
    try:
        model, fields = _request_fields(obj)
        try:
            return model.model_validate(fields, context={"limits": limits})
        except ValidationError as e:
            raise _protocol_error(e) from None
    except ProtocolError as e:
        e.session_id = _valid_session_id(obj, limits)  # the error reply names the session when it can
        raise


def _valid_session_id(obj: object, limits: Limits) -> Optional[str]:
    sid = obj.get("session_id") if isinstance(obj, dict) else None
    return sid if isinstance(sid, str) and 0 < len(sid) <= limits.max_session_id_chars else None


def decode_reply(data: bytes, max_bytes: int = 1 << 30) -> Reply:
    """One server frame -> CameraServerConfig | FrameReply | ResetOk | ResumeOk | Forked | Rewound | Paused |
    ErrorReply (client side)."""
    obj = _unpack(data, max_bytes=max_bytes, max_str_len=max_bytes, max_map_len=1024)
    try:
        return _REPLY.validate_python(obj)
    except ValidationError as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"not a server reply: {_protocol_error(e).message}") from None


def encode(message: BaseModel) -> bytes:
    """Any message -> one msgpack map (None fields left out, arrays as msgpack-numpy maps)."""
    return msgpack.packb(message.model_dump(mode="python", exclude_none=True),
                         use_bin_type=True, default=msgpack_numpy.encode)


def validated(kind: type[M], fields: dict, limits: Limits = DEFAULT_LIMITS) -> M:
    """Client side: the request `kind` from its fields, validated as the server validates it
    (the same limits); ProtocolError with the code the server would answer. `encode` packs it."""
    try:
        return kind.model_validate({k: v for k, v in fields.items() if v is not None}, context={"limits": limits})
    except ValidationError as e:
        raise _protocol_error(e) from None
