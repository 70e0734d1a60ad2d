"""Numeric arrays on the wire: msgpack-numpy maps, openpi `__ndarray__` maps, nested lists.

msgpack-numpy (`msgpack_numpy.packb`) writes `{nd: True, type: "<f4", kind: b"", shape, data}`
with bytes keys; openpi (vllm-omni clients) writes `{__ndarray__: True, data, dtype, shape}`.
Both are parsed here by hand rather than through `msgpack_numpy.decode`, which unpickles
`kind == "O"` arrays. Only bool/int/uint/float dtypes are accepted.
"""
from __future__ import annotations

import math

import numpy as np

from protocol.errors import ErrorCode, ProtocolError

MAX_NDIM = 4  # the protocol's arrays have 2 (intrinsics) or 3 (poses, image) dims
NUMERIC_KINDS = "biuf"


def wire_array(value: object, *, field: str, code: ErrorCode, kinds: str = NUMERIC_KINDS) -> np.ndarray:
    """Turn one wire-encoded array (or an ndarray) into an ndarray of a numeric dtype.

    Raises ProtocolError(code) naming `field` for anything that is not a well-formed array.
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, dict):
        arr = _from_map(value, field, code)
    elif isinstance(value, (list, tuple)):
        arr = _from_lists(value, field, code)
    else:
        raise ProtocolError(code, f"`{field}` must be an array (msgpack-numpy map, openpi `__ndarray__` "
                                  f"map or nested lists of numbers), got {type(value).__name__}")
    if arr.dtype.kind not in kinds:
        raise ProtocolError(code, f"`{field}` has dtype kind {arr.dtype.kind!r}; "
                                  f"expected one of {sorted(kinds)} (numbers, never objects)")
    if arr.ndim > MAX_NDIM:
        raise ProtocolError(code, f"`{field}` has {arr.ndim} dimensions; at most {MAX_NDIM} are meaningful")
    return arr


def _get(m: dict, key: str) -> object:
    """Map lookup that accepts the key as str or as bytes (both encoders occur)."""
    if key in m:
        return m[key]
    return m.get(key.encode())


def _from_map(m: dict, field: str, code: ErrorCode) -> np.ndarray:
    if _get(m, "nd") is True:  # msgpack-numpy
        if _get(m, "kind") not in (b"", ""):
            raise ProtocolError(code, f"`{field}`: msgpack-numpy `kind` must be empty (plain numeric "
                                      "dtype); object and structured arrays are not accepted")
        return _from_parts(_get(m, "type"), _get(m, "shape"), _get(m, "data"), field, code)
    if _get(m, "__ndarray__") is True:  # openpi
        return _from_parts(_get(m, "dtype"), _get(m, "shape"), _get(m, "data"), field, code)
    raise ProtocolError(code, f"`{field}` is a map but not an array encoding: expected msgpack-numpy "
                              "keys (nd, type, kind, shape, data) or openpi keys (__ndarray__, dtype, shape, data)")


def _from_parts(dtype: object, shape: object, data: object, field: str, code: ErrorCode) -> np.ndarray:
    if isinstance(dtype, bytes):
        dtype = dtype.decode("ascii", errors="replace")
    if not isinstance(dtype, str) or not 0 < len(dtype) <= 16:
        raise ProtocolError(code, f"`{field}`: dtype must be a short numpy dtype string such as '<f4'")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise ProtocolError(code, f"`{field}`: dtype is not a numpy dtype string such as '<f4'") from None
    if dt.kind not in NUMERIC_KINDS:
        raise ProtocolError(code, f"`{field}`: dtype kind {dt.kind!r} is not numeric (never objects)")
    if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise ProtocolError(code, f"`{field}`: shape must be a list of at most {MAX_NDIM} non-negative ints")
    if not isinstance(data, bytes):
        raise ProtocolError(code, f"`{field}`: data must be raw bytes (msgpack bin)")
    count = math.prod(shape)
    if count * dt.itemsize != len(data):
        raise ProtocolError(code, f"`{field}`: data holds {len(data)} bytes but shape {list(shape)} "
                                  f"of dtype {dt.str} needs {count * dt.itemsize}")
    try:  # a shape of no elements can still be too big for numpy ([2**62, 2**62, 0])
        return np.frombuffer(data, dtype=dt, count=count).reshape(shape)
    except ValueError:
        raise ProtocolError(code, f"`{field}`: shape {list(shape)} is not a valid array shape") from None


def _from_lists(value: list | tuple, field: str, code: ErrorCode) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise ProtocolError(code, f"`{field}`: nested lists do not form a rectangular array of numbers") from None


def finite_float32(arr: np.ndarray, *, field: str, code: ErrorCode) -> np.ndarray:
    """C-contiguous float32 copy of `arr`; rejects NaN/Inf and values beyond the float32 range."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ProtocolError(code, f"`{field}` contains NaN/Inf or values beyond the float32 range")
    return out
