"""Wire encodings of numeric arrays."""
from __future__ import annotations

import pickle

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from protocol.arrays import finite_float32, wire_array
from protocol.errors import ErrorCode, ProtocolError

A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def openpi_map(a: np.ndarray, key_type=str) -> dict:
    keys = {"__ndarray__": True, "data": a.tobytes(), "dtype": a.dtype.str, "shape": list(a.shape)}
    return {key_type(k, "ascii") if key_type is bytes else k: v for k, v in keys.items()}


def through_msgpack(obj: object) -> object:
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True, default=msgpack_numpy.encode), raw=False)


@pytest.mark.parametrize("encoded", [
    through_msgpack(A),  # msgpack-numpy: bytes keys, str type
    through_msgpack(openpi_map(A)),  # openpi, str keys
    through_msgpack(openpi_map(A, bytes)),  # openpi, bytes keys
    through_msgpack(A.tolist()),  # nested lists
    {"nd": True, "type": b"<f4", "kind": "", "shape": [2, 3, 4], "data": A.tobytes()},  # str keys, bytes type
    A,
])
def test_encodings_decode_to_the_same_array(encoded):
    got = wire_array(encoded, field="x", code=ErrorCode.BAD_CAMERAS)
    np.testing.assert_array_equal(got, A)


def test_big_endian_and_integer_dtypes():
    got = wire_array(through_msgpack(A.astype(">f8")), field="x", code=ErrorCode.BAD_CAMERAS)
    np.testing.assert_array_equal(got, A)
    got = wire_array(through_msgpack(A.astype(np.int16)), field="x", code=ErrorCode.BAD_CAMERAS)
    assert got.dtype == np.int16


class _Boom:
    def __reduce__(self):
        return (pytest.fail, ("object array payload was unpickled",))


def test_object_arrays_are_never_unpickled():
    evil = {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": pickle.dumps(_Boom())}
    with pytest.raises(ProtocolError, match="kind") as e:
        wire_array(evil, field="cameras.poses", code=ErrorCode.BAD_CAMERAS)
    assert e.value.code is ErrorCode.BAD_CAMERAS
    evil = {b"nd": True, b"type": "|O", b"kind": b"", b"shape": [1], b"data": pickle.dumps(_Boom())}
    with pytest.raises(ProtocolError, match="not numeric"):
        wire_array(evil, field="x", code=ErrorCode.BAD_CAMERAS)


@pytest.mark.parametrize("bad, match", [
    ({"nd": True, "type": "<f4", "kind": "", "shape": [2, 2], "data": b"\x00" * 15}, "needs 16"),
    ({"nd": True, "type": "<f4", "kind": "", "shape": [-1], "data": b""}, "shape"),
    ({"nd": True, "type": "<f4", "kind": "", "shape": [1] * 5, "data": b"\x00" * 4}, "shape"),
    ({"nd": True, "type": "<f4", "kind": "", "shape": [True], "data": b"\x00" * 4}, "shape"),
    ({"nd": True, "type": "<f4", "kind": "", "shape": [1], "data": "abcd"}, "raw bytes"),
    ({"nd": True, "type": "not-a-dtype", "kind": "", "shape": [1], "data": b"\x00"}, "dtype"),
    ({"nd": True, "type": 5, "kind": "", "shape": [1], "data": b"\x00"}, "dtype"),
    ({"nd": True, "type": "<U4", "kind": "", "shape": [1], "data": b"\x00" * 16}, "not numeric"),
    ({"nd": True, "type": "<c8", "kind": "", "shape": [1], "data": b"\x00" * 8}, "not numeric"),
    ({"nd": True, "type": [["a", "<f4"]], "kind": b"V", "shape": [1], "data": b"\x00" * 4}, "kind"),
    ({"__ndarray__": True, "dtype": "<f4", "shape": [3], "data": b"\x00" * 4}, "needs 12"),
    ({"poses": 1}, "not an array encoding"),
    ([[1.0, 2.0], [3.0]], "rectangular"),
    ([["a", "b"]], "dtype kind"),
    ([[1, None]], "dtype kind"),
    ([2**70], "dtype kind"),
    ("1 2 3", "must be an array"),
    (3.5, "must be an array"),
])
def test_malformed_arrays(bad, match):
    with pytest.raises(ProtocolError, match=match) as e:
        wire_array(bad, field="cameras.poses", code=ErrorCode.BAD_CAMERAS)
    assert e.value.code is ErrorCode.BAD_CAMERAS and "`cameras.poses`" in e.value.message


def test_kinds_restrict_dtypes():
    with pytest.raises(ProtocolError, match="dtype kind 'b'"):
        wire_array([[True, False]], field="x", code=ErrorCode.BAD_CAMERAS, kinds="iuf")


def test_finite_float32_rejects_nan_inf_and_float32_overflow():
    for bad in (np.nan, np.inf, -np.inf, 1e300):
        with pytest.raises(ProtocolError, match="NaN/Inf"):
            finite_float32(np.array([1.0, bad]), field="x", code=ErrorCode.BAD_CAMERAS)
    out = finite_float32(np.array([[1, 2]], dtype=np.int64), field="x", code=ErrorCode.BAD_CAMERAS)
    assert out.dtype == np.float32 and out.flags.c_contiguous
