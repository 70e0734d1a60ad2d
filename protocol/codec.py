"""msgpack frames <-> validated messages.

`decode` is the server's intake: it never raises anything but `ProtocolError(code, message)`.
`encode` packs any message (replies, and requests on the client side) as one msgpack map,
numpy arrays as msgpack-numpy maps and bytes as msgpack bin.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional, TypeVar

import msgpack
import msgpack_numpy
import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from camera.plan import SessionPlan
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import (REQUEST_TYPES, AckRequest, ControlRequest, DriveRequest, ForkRequest, InferRequest, Reply,
                               Request, ResetRequest, ResumeRequest, RewindRequest)

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


def encode_infer(session_id: str, poses: Optional[np.ndarray] = None, intrinsics: Optional[np.ndarray] = None, *,
                 from_keys: bool = False,
                 image: Optional[bytes | np.ndarray] = None, prompt: Optional[str] = None,
                 seed: Optional[int] = None, size: Optional[str] = None,
                 intrinsics_resolution: Optional[tuple[int, int]] = None, num_frames: Optional[int] = None,
                 translation_scale: Optional[float] = None, client_chunk_id: Optional[int] = None,
                 prompt_update: Optional[str] = None, resume_token: Optional[str] = None,
                 resume_from: Optional[int] = None, prefix_cache: Optional[bool] = None,
                 limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Validate and pack one infer (poses [N,4,4], intrinsics [N,4] -> float32), or with
    `from_keys` and no poses one whose camera the keys held move (`encode_control`). The
    server's peers mode and the tests pack infers with it; the client builds an `InferRequest`
    (client/requests.py) and packs it with `encode`.

    Raises ProtocolError with the code the server would answer.
    """
    scalars = {"seed": seed, "num_frames": num_frames, "client_chunk_id": client_chunk_id}
    fields = {
        "session_id": session_id, "from_keys": from_keys or None,
        "cameras": None if poses is None and intrinsics is None else {"poses": poses, "intrinsics": intrinsics},
        "image": image, "prompt": prompt, "prompt_update": prompt_update, "size": size, "resume_token": resume_token,
        "resume_from": None if resume_from is None else int(resume_from), "prefix_cache": prefix_cache,
        "intrinsics_resolution": intrinsics_resolution, "translation_scale": None if translation_scale is None else float(translation_scale),
        **{k: None if v is None else int(v) for k, v in scalars.items()},
    }
    try:
        req = InferRequest.model_validate(fields, context={"limits": limits})
    except ValidationError as e:
        raise _protocol_error(e) from None
    return encode(req)


def encode_plan(plan: SessionPlan, session_id: str, image: bytes | np.ndarray, prompt: str, *,
                seed: Optional[int] = None, size: Optional[str] = None,
                intrinsics_resolution: Optional[tuple[int, int]] = None,
                prompt_schedule: Optional[dict[int, str]] = None, open_ended: bool = False,
                limits: Limits = DEFAULT_LIMITS) -> list[bytes]:
    """Client side: the packed infers of a planned session (`camera.plan_session`), in order.

    The first carries image, prompt and the session options, with the plan's `num_frames` and
    `translation_scale`: the session then reproduces the offline run (PROTOCOL.md §2).
    `prompt_schedule` {chunk: prompt} (chunks >= 1): `prompt_update` on those chunks' infers
    (prompt steering; the offline equivalent is `WorldPipeline.generate(prompt_schedule=...)`).
    `open_ended`: declare no `num_frames` (an open-ended session: per-chunk noise, and the
    server's rolling window where it has one), as an interactive client that does not know
    its length.
    """
    schedule = dict(prompt_schedule or {})
    if any(not 1 <= c < len(plan.chunk_poses) for c in schedule):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"prompt_schedule chunks must be in 1..{len(plan.chunk_poses) - 1}")
    out = []
    for k, poses in enumerate(plan.chunk_poses):
        first = {"prompt_update": schedule[k]} if k in schedule else {} if k else {
            "image": image, "prompt": prompt, "seed": seed, "size": size,
            "intrinsics_resolution": intrinsics_resolution, "num_frames": None if open_ended else plan.num_frames,
            "translation_scale": plan.translation_scale,
        }
        out.append(encode_infer(session_id, poses, plan.chunk_intrinsics(k), client_chunk_id=k, limits=limits,
                                **first))
    return out


def encode_resume(session_id: str, resume_token: str, resume_from: Optional[int] = None) -> bytes:
    """Client side: pack one resume request (continue a session on a new connection)."""
    try:
        return encode(ResumeRequest(session_id=session_id, resume_token=resume_token, resume_from=resume_from))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_control(session_id: str, event_id: int, keys: Iterable[str]) -> bytes:
    """Client side: pack one control (the keys held now, the whole state; `[]` releases all)."""
    try:
        return encode(ControlRequest.model_validate({"session_id": session_id, "event_id": int(event_id),
                                                     "keys": list(keys)}))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_reset(session_id: str) -> bytes:
    """Client side: pack one reset request."""
    try:
        return encode(ResetRequest(session_id=session_id))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_fork(session_id: str, new_session_id: str, at_chunk: int) -> bytes:
    """Client side: pack one fork request (a new session from `session_id`'s first `at_chunk` chunks)."""
    try:
        return encode(ForkRequest(session_id=session_id, new_session_id=new_session_id, at_chunk=int(at_chunk)))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_rewind(session_id: str, to_chunk: int) -> bytes:
    """Client side: pack one rewind request (the session's next infer produces `to_chunk`)."""
    try:
        return encode(RewindRequest(session_id=session_id, to_chunk=int(to_chunk)))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_drive(session_id: str, image: bytes | np.ndarray, prompt: str, *, seed: Optional[int] = None,
                 size: Optional[str] = None, intrinsics_resolution: Optional[tuple[int, int]] = None,
                 num_frames: Optional[int] = None, translation_scale: Optional[float] = None,
                 limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Client side: pack one drive request (a session the server runs from the keys held)."""
    fields = {"session_id": session_id, "image": image, "prompt": prompt, "seed": None if seed is None else int(seed),
              "size": size, "intrinsics_resolution": intrinsics_resolution,
              "num_frames": None if num_frames is None else int(num_frames),
              "translation_scale": None if translation_scale is None else float(translation_scale)}
    try:
        return encode(DriveRequest.model_validate(fields, context={"limits": limits}))
    except ValidationError as e:
        raise _protocol_error(e) from None


def encode_ack(session_id: str, chunk_id: int) -> bytes:
    """Client side: pack one ack (the driven session's frame replies received up to `chunk_id`)."""
    try:
        return encode(AckRequest.model_validate({"session_id": session_id, "chunk_id": int(chunk_id)}))
    except ValidationError as e:
        raise _protocol_error(e) from None
