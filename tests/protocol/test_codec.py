"""decode(): property-based fuzzing (only ProtocolError, the right code per malformed field),
compatibility leniencies, limits."""
from __future__ import annotations

import io
import math
import struct

import msgpack
import msgpack_numpy
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy.spatial.transform import Rotation

from camera import chunk_cameras, translation_scale
from protocol import (ErrorCode, InferRequest, Limits, ProtocolError, ResetRequest, decode, decode_image,
                      require_session_start)
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from support import EXAMPLES

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=150, deadline=None)


def _png(w: int = 32, h: int = 24) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (30, 60, 90)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png()
POSES = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
POSES[:, :3, :3] = Rotation.random(12, random_state=0).as_matrix()
POSES[:, :3, 3] = np.linspace(0, 1, 36).reshape(12, 3)
INTRINSICS = np.tile(np.array([500.0, 480.0, 416.0, 240.0], dtype=np.float32), (12, 1))


def fields(**overrides: object) -> dict:
    """A valid first infer as a dict of wire values (arrays as ndarrays, packed by msgpack-numpy)."""
    out = {"endpoint": "infer", "session_id": "s1", "image": PNG, "prompt": "a street",
           "cameras": {"poses": POSES, "intrinsics": INTRINSICS}, "seed": 42, "size": "480*832",
           "intrinsics_resolution": [480, 832], "num_frames": 81, "translation_scale": 0.5, "client_chunk_id": 0}
    out.update(overrides)
    return out


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=msgpack_numpy.encode)


def pack_raw_value(field: str, raw: bytes) -> bytes:
    """A valid infer whose `field` (top level or `cameras.x`) is the raw msgpack bytes `raw`."""
    def raw_map(items: dict[str, bytes]) -> bytes:
        assert len(items) < 16
        return bytes([0x80 | len(items)]) + b"".join(pack(k) + v for k, v in items.items())

    top = {k: pack(v) for k, v in fields().items() if k != "cameras"}
    cams = {k: pack(v) for k, v in fields()["cameras"].items()}
    if field.startswith("cameras."):
        cams[field.split(".")[1]] = raw
    else:
        top[field] = raw
    if field != "cameras":
        top["cameras"] = raw_map(cams)
    return raw_map(top)


VALID = pack(fields())


def outcome(data: bytes, limits: Limits = Limits()) -> ProtocolError | InferRequest | ResetRequest:
    """decode(); anything but a ProtocolError escaping fails the test."""
    try:
        return decode(data, limits)
    except ProtocolError as e:
        assert isinstance(e.code, ErrorCode) and e.message
        return e


def code(data: bytes, limits: Limits = Limits()) -> ErrorCode:
    got = outcome(data, limits)
    assert isinstance(got, ProtocolError), f"accepted: {got!r}"
    return got.code


def test_valid_frame_decodes():
    req = decode(VALID)
    assert isinstance(req, InferRequest)
    np.testing.assert_array_equal(req.cameras.poses, POSES)


# ---------------------------------------------------------------- random and mutated frames

@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=3000))
def test_random_bytes(data):
    outcome(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([VALID, pack(fields(image=None)), pack({"endpoint": "reset",
                                                                                   "session_id": "s"})])))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "byte", "insert", "delete", "truncate"]))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        else:
            del data[i:]
        if not data:
            break
    return bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_valid_frames(data):
    outcome(data)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8),
                                                               inner, max_size=5),
    max_leaves=25)
ALL_FIELDS = list(fields()) + ["cameras.poses", "cameras.intrinsics", "camera", "unknown"]


@FUZZ
@given(st.sampled_from(ALL_FIELDS), msgpack_values)
def test_random_values_in_any_field(field, value):
    if field.startswith("cameras."):
        cams = dict(fields()["cameras"], **{field.split(".")[1]: value})
        outcome(pack(fields(cameras=cams)))
    else:
        outcome(pack(fields(**{field: value})))


# ---------------------------------------------------------------- wrong types per field -> code

ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
non_str = (ints | st.floats() | st.booleans() | st.binary(max_size=8)
           | st.lists(ints, max_size=3) | st.dictionaries(st.text(max_size=3), ints, max_size=2))
non_int = (st.floats() | st.booleans() | st.text(max_size=8) | st.binary(max_size=8)
           | st.lists(ints, max_size=3) | st.dictionaries(st.text(max_size=3), ints, max_size=2))
BAD_VALUES = {
    "endpoint": (non_str | st.none() | st.text(max_size=10)).filter(lambda v: v not in ("infer", "reset")),
    "session_id": non_str | st.none() | st.just(""),
    "prompt": non_str,
    "seed": non_int | st.integers(-(2**63), -1),
    "num_frames": non_int | st.integers(-(2**63), 2**63).filter(lambda n: n < 1 or (n - 1) % 4),
    "client_chunk_id": non_int,
    "translation_scale": (st.text(max_size=8) | st.binary(max_size=8) | st.booleans()
                          | st.lists(st.floats(), max_size=2) | st.floats(max_value=0.0) | st.integers(-(2**63), 0)
                          | st.sampled_from([math.nan, math.inf, -math.inf])),
    "size": (non_str | st.text(max_size=12)).filter(
        lambda v: not (isinstance(v, str) and v.count("*") == 1 and all(p.isdigit() and len(p) < 6 and int(p) >= 16
                                                                        for p in v.split("*")))),
    "intrinsics_resolution": (ints | st.text(max_size=8)
                              | st.lists(st.integers(1, 100), max_size=4).filter(lambda v: len(v) != 2)
                              | st.lists(st.integers(-(2**63), 0), min_size=2, max_size=2)
                              | st.lists(st.floats() | st.text(max_size=3), min_size=2, max_size=2)),
    "image": (ints | st.floats() | st.booleans() | st.text(max_size=8)
              | st.binary(max_size=64) | st.lists(st.text(max_size=3), min_size=1, max_size=3)
              | st.dictionaries(st.text(max_size=3), ints, max_size=2)),
    "cameras": (ints | st.floats() | st.booleans() | st.text(max_size=8) | st.binary(max_size=8)
                | st.lists(ints, max_size=3)),
}
FIELD_CODE = {f: ErrorCode.BAD_MESSAGE for f in BAD_VALUES} | {"image": ErrorCode.BAD_IMAGE,
                                                               "cameras": ErrorCode.BAD_CAMERAS}


@FUZZ
@given(st.data())
def test_wrong_type_per_field_has_the_fields_code(data):
    field = data.draw(st.sampled_from(sorted(BAD_VALUES)))
    value = data.draw(BAD_VALUES[field])
    assert code(pack(fields(**{field: value}))) is FIELD_CODE[field], (field, value)


@pytest.mark.parametrize("field", ["session_id", "cameras"])
def test_missing_required_field(field):
    msg = fields()
    del msg[field]
    assert code(pack(msg)) is ErrorCode.MISSING_FIELD
    assert code(pack(fields(cameras={"poses": POSES}))) is ErrorCode.MISSING_FIELD


# ---------------------------------------------------------------- depth bombs, huge lengths, sizes

DEPTH_CODE = {"cameras.poses": ErrorCode.BAD_CAMERAS, "cameras.intrinsics": ErrorCode.BAD_CAMERAS,
              "cameras": ErrorCode.BAD_CAMERAS, "image": ErrorCode.BAD_IMAGE, "prompt": ErrorCode.BAD_MESSAGE,
              "session_id": ErrorCode.BAD_MESSAGE, "seed": ErrorCode.BAD_MESSAGE, "size": ErrorCode.BAD_MESSAGE}


@pytest.mark.parametrize("field", sorted(DEPTH_CODE))
@pytest.mark.parametrize("depth", [33, 500, 1000])
def test_nested_depth_bombs(field, depth):
    assert code(pack_raw_value(field, b"\x91" * depth + b"\xc0")) is DEPTH_CODE[field]  # [[[...]]]
    # {"k": {"k": ...}}: a map without `poses`/`intrinsics` where `cameras` belongs
    expected = ErrorCode.MISSING_FIELD if field == "cameras" else DEPTH_CODE[field]
    assert code(pack_raw_value(field, b"\x81\xa1k" * depth + b"\xc0")) is expected


@pytest.mark.parametrize("field", sorted(DEPTH_CODE))
def test_depth_beyond_the_unpacker_stack(field):
    assert code(pack_raw_value(field, b"\x91" * 5000 + b"\xc0")) is ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize("header, expected", [
    (b"\xdf\xff\xff\xff\xff", ErrorCode.TOO_LARGE),  # map32: over max_map_len
    (b"\xde\x01\x00", ErrorCode.TOO_LARGE),  # map16 of 256 entries
    (b"\xdd\xff\xff\xff\xff", ErrorCode.BAD_MESSAGE),  # array32: more elements than the frame has bytes
    (b"\xdc\xff\xff", ErrorCode.BAD_MESSAGE),
    (b"\xdb\xff\xff\xff\xff", ErrorCode.BAD_MESSAGE),  # str32: the frame ends first
    (b"\xda\xff\xff", ErrorCode.BAD_MESSAGE),
    (b"\xc6\xff\xff\xff\xff", ErrorCode.BAD_MESSAGE),  # bin32
])
@pytest.mark.parametrize("field", ["prompt", "image", "cameras.poses", "cameras"])
def test_huge_declared_lengths(field, header, expected):
    assert code(pack_raw_value(field, header + b"\x00" * 8)) is expected


def test_strings_over_the_unpacker_limit_are_too_large():
    raw = b"\xdb" + struct.pack(">I", 20000) + b"x" * 20000  # a real 20000-byte string
    assert code(pack_raw_value("prompt", raw)) is ErrorCode.TOO_LARGE


def test_truncated_and_trailing_bytes_are_bad_message():
    assert code(VALID[:-1]) is ErrorCode.BAD_MESSAGE
    assert code(VALID + b"\xc0") is ErrorCode.BAD_MESSAGE
    assert code(b"") is ErrorCode.BAD_MESSAGE


def test_ext_types_are_bad_message():
    assert code(pack_raw_value("seed", b"\xd4\x01\x02")) is ErrorCode.BAD_MESSAGE
    assert code(pack_raw_value("seed", b"\xd6\xff\x00\x00\x00\x01")) is ErrorCode.BAD_MESSAGE  # timestamp


def test_message_and_field_limits():
    small = Limits(max_message_bytes=len(VALID) - 1)
    assert code(VALID, small) is ErrorCode.TOO_LARGE
    assert code(pack(fields(prompt="x" * 4097))) is ErrorCode.TOO_LARGE
    assert isinstance(outcome(pack(fields(prompt="é" * 4096))), InferRequest)  # chars, not bytes
    assert code(pack(fields(prompt="é" * 4096)), Limits(max_prompt_chars=10)) is ErrorCode.TOO_LARGE
    assert code(pack(fields(session_id="s" * 129))) is ErrorCode.TOO_LARGE
    assert code(pack(fields(image=PNG)), Limits(max_image_bytes=len(PNG) - 1)) is ErrorCode.TOO_LARGE
    assert isinstance(outcome(pack(fields(num_frames=961))), InferRequest)
    assert code(pack(fields(num_frames=965)), Limits(max_num_frames=961)) is ErrorCode.TOO_LARGE
    assert code(pack(fields(size="1000*1000"))) is ErrorCode.TOO_LARGE
    assert code(pack(fields(size="480*832\n"))) is ErrorCode.BAD_MESSAGE
    many = {"poses": np.tile(np.eye(4), (49, 1, 1)), "intrinsics": np.tile(INTRINSICS[:1], (49, 1))}
    assert code(pack(fields(cameras=many))) is ErrorCode.TOO_LARGE
    assert code(pack({**fields(), **{f"x{i}": i for i in range(60)}})) is ErrorCode.TOO_LARGE  # map entries


def test_not_a_map_and_bad_keys():
    for obj in ([1, 2], "infer", 3, None):
        assert code(pack(obj)) is ErrorCode.BAD_MESSAGE
    assert code(pack({b"session_id": b"s"})) is ErrorCode.BAD_MESSAGE
    assert code(b"\x81\x01\x02") is ErrorCode.BAD_MESSAGE  # int key


# ---------------------------------------------------------------- cameras content

def with_cameras(poses: np.ndarray, intrinsics: np.ndarray) -> bytes:
    return pack(fields(cameras={"poses": poses, "intrinsics": intrinsics}))


@FEW
@given(st.sampled_from(["poses", "intrinsics"]), st.integers(0, 11), st.integers(0, 15),
       st.sampled_from([math.nan, math.inf, -math.inf, 1e39]), st.sampled_from(["numpy", "lists"]))
def test_non_finite_values(which, row, pos, value, encoding):
    poses, intrinsics = POSES.astype(np.float64), INTRINSICS.astype(np.float64)
    target = poses if which == "poses" else intrinsics
    target[row].flat[pos % target[row].size] = value
    cams = {"poses": poses, "intrinsics": intrinsics}
    if encoding == "lists":
        cams = {k: v.tolist() for k, v in cams.items()}
    got = outcome(pack(fields(cameras=cams)))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS
    assert "NaN/Inf" in got.message or "rigid" in got.message or "focal" in got.message


shapes = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple)


@FEW
@given(shapes, shapes)
def test_wrong_shapes(pose_shape, k_shape):
    poses_ok = len(pose_shape) == 3 and pose_shape[1:] == (4, 4)
    assume(not (poses_ok and len(k_shape) == 2 and k_shape[1] == 4 and pose_shape[0] == k_shape[0] > 0))
    poses = np.zeros(pose_shape)
    if poses_ok:
        poses[:] = np.eye(4)  # rigid, so that only the shapes are wrong
    got = outcome(with_cameras(poses, np.full(k_shape, 100.0)))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS
    assert "shape" in got.message or "N = 0" in got.message or "poses but" in got.message


@pytest.mark.parametrize("encoding", ["numpy", "lists", "openpi"])
def test_zero_poses(encoding):
    poses, intrinsics = np.zeros((0, 4, 4), np.float32), np.zeros((0, 4), np.float32)
    if encoding == "lists":
        poses, intrinsics = [], []
    elif encoding == "openpi":
        poses = {"__ndarray__": True, "data": b"", "dtype": "<f4", "shape": [0, 4, 4]}
    got = outcome(pack(fields(cameras={"poses": poses, "intrinsics": intrinsics})))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS and "N = 0" in got.message


def test_pose_and_intrinsics_counts_must_match():
    got = outcome(with_cameras(POSES, INTRINSICS[:3]))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS and "12 poses but 3" in got.message


@st.composite
def non_rigid(draw: st.DrawFn) -> np.ndarray:
    poses = POSES.astype(np.float64).copy()
    i = draw(st.integers(0, 11))
    kind = draw(st.sampled_from(["scale", "shear", "reflect", "last_row", "random"]))
    big = draw(st.floats(3e-3, 10.0))
    if kind == "scale":
        poses[i, :3, :3] *= 1.0 + big * draw(st.sampled_from([1, -0.2]))
    elif kind == "shear":
        poses[i, draw(st.integers(0, 2)), draw(st.integers(0, 2))] += big
    elif kind == "reflect":
        poses[i, :3, draw(st.integers(0, 2))] *= -1.0
    elif kind == "last_row":
        poses[i, 3, draw(st.integers(0, 3))] += big
    else:
        poses[i, :3, :3] = np.random.default_rng(draw(st.integers(0, 2**32))).normal(size=(3, 3))
    return poses


@FEW
@given(non_rigid())
def test_non_rigid_poses(poses):
    got = outcome(with_cameras(poses, INTRINSICS))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS and "rigid" in got.message


@FEW
@given(st.integers(1, 48), st.integers(0, 2**32 - 1), st.floats(0, 1e-4), st.floats(-1e4, 1e4),
       st.sampled_from(["numpy", "lists", "openpi", "float64"]))
def test_rigid_poses_within_tolerance_are_accepted(n, seed, noise, shift, encoding):
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (n, 1, 1))
    poses[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix() + rng.uniform(-noise, noise, (n, 3, 3))
    poses[:, :3, 3] = rng.normal(size=(n, 3)) * shift
    intrinsics = rng.uniform(1, 2000, (n, 4))
    encoded = {"numpy": lambda a: a.astype(np.float32), "float64": lambda a: a, "lists": lambda a: a.tolist(),
               "openpi": lambda a: {"__ndarray__": True, "data": a.astype("<f4").tobytes(), "dtype": "<f4",
                                    "shape": list(a.shape)}}[encoding]
    req = outcome(pack(fields(cameras={"poses": encoded(poses), "intrinsics": encoded(intrinsics)})))
    assert isinstance(req, InferRequest), req
    np.testing.assert_array_equal(req.cameras.poses, poses.astype(np.float32))
    np.testing.assert_array_equal(req.cameras.intrinsics, intrinsics.astype(np.float32))


@FEW
@given(st.integers(0, 11), st.integers(0, 1), st.floats(-1e6, 0.0))
def test_non_positive_focal_lengths(row, col, value):
    intrinsics = INTRINSICS.copy()
    intrinsics[row, col] = value
    got = outcome(with_cameras(POSES, intrinsics))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_CAMERAS and "focal" in got.message


def test_principal_point_may_be_anything_finite():
    intrinsics = INTRINSICS.copy()
    intrinsics[:, 2:] = [-5.0, 1e6]
    assert isinstance(outcome(with_cameras(POSES, intrinsics)), InferRequest)


def test_rotation_tolerance_is_a_limit():
    poses = POSES.copy()
    poses[0, :3, :3] *= 1.002  # |R^T R - I| ~ 4e-3
    assert code(with_cameras(poses, INTRINSICS)) is ErrorCode.BAD_CAMERAS
    assert isinstance(outcome(with_cameras(poses, INTRINSICS), Limits(rotation_tolerance=1e-2)), InferRequest)


# ---------------------------------------------------------------- compatibility leniencies

def test_missing_endpoint_is_infer():
    msg = fields()
    del msg["endpoint"]
    assert isinstance(decode(pack(msg)), InferRequest)


def test_camera_alias():
    msg = fields()
    msg["camera"] = msg.pop("cameras")
    np.testing.assert_array_equal(decode(pack(msg)).cameras.poses, POSES)
    assert code(pack(fields(camera=fields()["cameras"]))) is ErrorCode.BAD_MESSAGE  # both given


def test_vllm_omni_style_message():
    """No endpoint, `camera`, openpi arrays with bytes keys, raw RGB image array."""
    def openpi(a: np.ndarray) -> dict:
        return {b"__ndarray__": True, b"data": a.tobytes(), b"dtype": a.dtype.str, b"shape": list(a.shape)}

    rgb = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    req = decode(pack({"session_id": "v", "prompt": "p", "image": openpi(rgb),
                       "camera": {"poses": openpi(POSES), "intrinsics": openpi(INTRINSICS)}}))
    assert isinstance(req, InferRequest)
    np.testing.assert_array_equal(req.image, rgb)
    np.testing.assert_array_equal(req.cameras.intrinsics, INTRINSICS)


def test_extra_fields_are_ignored_and_reset_needs_only_session_id():
    assert isinstance(decode(pack(fields(future_option=1))), InferRequest)
    req = decode(pack({"endpoint": "reset", "session_id": "s", "cameras": "ignored"}))
    assert isinstance(req, ResetRequest) and req.session_id == "s"


def test_image_fields():
    assert code(pack(fields(image=b"GIF89a" + b"\x00" * 20))) is ErrorCode.BAD_IMAGE
    assert code(pack(fields(image=_png(8, 64)))) is ErrorCode.BAD_IMAGE  # side < 16
    assert code(pack(fields(image=np.zeros((20, 20, 4), np.uint8)))) is ErrorCode.BAD_IMAGE
    assert code(pack(fields(image=np.zeros((20, 20, 3), np.float32)))) is ErrorCode.BAD_IMAGE
    assert code(pack(fields(image=np.full((20, 20, 3), 300, np.int32)))) is ErrorCode.BAD_IMAGE
    lists = np.full((20, 20, 3), 7).tolist()
    np.testing.assert_array_equal(decode(pack(fields(image=lists))).image, np.full((20, 20, 3), 7, np.uint8))


def test_infer_request_raises_the_servers_code_on_the_client():
    with pytest.raises(ProtocolError) as e:
        encode(infer_request("s", POSES[:, ::-1], INTRINSICS))
    assert e.value.code is ErrorCode.BAD_CAMERAS
    with pytest.raises(ProtocolError) as e:
        encode(infer_request("", POSES, INTRINSICS))
    assert e.value.code is ErrorCode.BAD_MESSAGE


def test_numbers_in_messages_are_never_echoed():
    """Messages describe the problem, not the input (no repr of hostile values)."""
    got = outcome(pack(fields(prompt=["x" * 50])))
    assert isinstance(got, ProtocolError) and "x" * 50 not in got.message


@pytest.mark.parametrize("example", ["00", "01", "02", "03", "04", "05"])
def test_reference_examples_travel_intact(shared_dir, example):
    """A client streaming a reference example (image, prompt, 81-frame trajectory sliced per
    chunk, the reference's translation_scale) gets every message accepted, arrays unchanged."""
    folder = EXAMPLES / example
    poses, intrinsics = np.load(folder / "poses.npy"), np.load(folder / "intrinsics.npy")
    image, prompt = (folder / "image.jpg").read_bytes(), (folder / "prompt.txt").read_text()
    scale = translation_scale(poses, 81)
    for k in range(7):
        chunk_poses, chunk_intrinsics = chunk_cameras(poses, intrinsics, k)
        first = SessionStart(image, prompt, seed=42, num_frames=81, translation_scale=scale,
                             intrinsics_resolution=(480, 832)) if k == 0 else None
        req = decode(encode(infer_request(f"ex{example}", chunk_poses, chunk_intrinsics, start=first,
                                          client_chunk_id=k)))
        np.testing.assert_array_equal(req.cameras.poses, chunk_poses.astype(np.float32))
        np.testing.assert_array_equal(req.cameras.intrinsics, chunk_intrinsics.astype(np.float32))
        assert req.client_chunk_id == k
        if k == 0:
            require_session_start(req)
            assert req.translation_scale == scale and req.prompt == prompt
            with Image.open(folder / "image.jpg") as im:
                assert decode_image(req.image).shape == (im.height, im.width, 3)


def test_a_frame_of_millions_of_small_numbers_is_refused_before_it_becomes_a_list():
    n = 5_000_000  # one-byte ints: a 5 MB frame, under the message cap, that would be a 40 MB list
    flat = b"\xdd" + struct.pack(">I", n) + b"\x00" * n
    assert code(pack_raw_value("cameras.poses", flat)) is ErrorCode.TOO_LARGE  # one array over max_array_len
    rows = b"\xdc" + struct.pack(">H", 2048) + (b"\xdc" + struct.pack(">H", 2048) + b"\x00" * 2048) * 2048
    assert code(pack_raw_value("image", rows)) is ErrorCode.TOO_LARGE  # 4 M elements over all arrays
    small = Limits(max_array_elements=47)  # a chunk's 12 poses as nested lists hold 12*4 + 12*4*4 = 240
    nested = {"poses": POSES.tolist(), "intrinsics": INTRINSICS.tolist()}
    assert code(pack({**fields(), "cameras": nested}), small) is ErrorCode.TOO_LARGE
    assert isinstance(outcome(pack({**fields(), "cameras": nested})), InferRequest)  # the defaults take it


def test_an_error_reply_keeps_the_valid_session_id_of_a_refused_request():
    err = outcome(pack({**fields(), "seed": "not a number"}))
    assert isinstance(err, ProtocolError) and err.session_id == fields()["session_id"]
    err = outcome(pack({**fields(), "session_id": 7}))
    assert isinstance(err, ProtocolError) and err.session_id is None  # not a valid id: nothing echoed


@pytest.mark.parametrize("scale", [1e-300, 1e-7, 0.0, 1e7, 1e300])
def test_translation_scale_outside_the_float32_safe_range_is_bad_message(scale):
    got = outcome(pack({**fields(), "translation_scale": scale}))
    assert isinstance(got, ProtocolError) and got.code is ErrorCode.BAD_MESSAGE, got


def test_pose_translations_beyond_the_bound_are_bad_cameras():
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 12, axis=0)
    poses[5, 0, 3] = 2e6
    cams = {"poses": poses.tolist(), "intrinsics": [[500.0, 500.0, 416.0, 240.0]] * 12}
    assert code(pack({**fields(), "cameras": cams})) is ErrorCode.BAD_CAMERAS


class TestOpenpiScalars:
    """openpi's msgpack_numpy writes NumPy scalars as `{__npgeneric__: True, data, dtype}` maps."""

    @staticmethod
    def _openpi_infer(**extra) -> bytes:
        from openpi_client import msgpack_numpy as openpi  # the peers' own encoder
        poses = np.repeat(np.eye(4, dtype=np.float32)[None], 12, axis=0)
        intr = np.tile(np.array([500, 500, 416, 240], np.float32), (12, 1))
        image = np.zeros((32, 32, 3), np.uint8)  # raw RGB, as their client sends it
        return openpi.packb({"endpoint": "infer", "session_id": "s", "prompt": "p", "image": image,
                             "cameras": {"poses": poses, "intrinsics": intr}, **extra})

    def test_a_numpy_seed_is_an_int(self):
        pytest.importorskip("openpi_client")
        req = decode(self._openpi_infer(seed=np.int64(7), num_frames=np.uint16(33)))
        assert req.seed == 7 and type(req.seed) is int
        assert req.num_frames == 33

    def test_a_numpy_float_scalar_is_a_float(self):
        pytest.importorskip("openpi_client")
        req = decode(self._openpi_infer(translation_scale=np.float32(2.5)))
        assert req.translation_scale == 2.5

    @pytest.mark.parametrize("scalar", [
        {"__npgeneric__": True, "data": b"x", "dtype": "<i8"},  # data not a number
        {"__npgeneric__": True, "data": 1, "dtype": "|O"},  # object dtype
        {"__npgeneric__": True, "data": 1, "dtype": "nonsense"},
        {"__npgeneric__": True, "data": 300, "dtype": "|u1"},  # does not fit
    ])
    def test_a_bad_scalar_is_bad_message(self, scalar):
        data = msgpack.packb({"endpoint": "reset", "session_id": "s", "x": scalar}, use_bin_type=True)
        with pytest.raises(ProtocolError) as e:
            decode(data)
        assert e.value.code is ErrorCode.BAD_MESSAGE


def test_an_open_ended_plan_declares_no_num_frames():
    """plan_requests(open_ended=True): the same infers, the first without num_frames (the session
    is open-ended: per-chunk noise, the server's window); the default declares the plan's length."""
    from camera.plan import plan_session
    from protocol.requests import plan_requests

    poses = np.tile(np.eye(4, dtype=np.float32), (33, 1, 1))
    poses[:, 2, 3] = np.linspace(0, 1, 33)
    plan = plan_session(poses, np.tile([[500.0, 500, 416, 240]], (33, 1)).astype(np.float32), 33)
    buf = io.BytesIO()
    Image.new("RGB", (64, 36), (90, 120, 150)).save(buf, format="PNG")
    start = SessionStart(buf.getvalue(), "p")
    declared = [decode(encode(r)) for r in plan_requests(plan, "s", start)]
    open_ended = [decode(encode(r)) for r in plan_requests(plan, "s", start, open_ended=True)]
    assert declared[0].num_frames == 33 and open_ended[0].num_frames is None
    assert len(declared) == len(open_ended) == 3
    assert open_ended[0].translation_scale == declared[0].translation_scale
    for a, b in zip(declared, open_ended):
        assert np.array_equal(a.cameras.poses, b.cameras.poses)
