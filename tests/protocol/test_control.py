"""The wire of key control: `control`, an infer with `from_keys`, and the frame reply's `event_id`
and `poses` (PROTOCOL.md, `control`)."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

from protocol import ControlRequest, ErrorCode, FrameReply, InferRequest, ProtocolError, decode, decode_reply, encode
from protocol.requests import infer_request


def code(data: bytes) -> ErrorCode:
    with pytest.raises(ProtocolError) as e:
        decode(data)
    return e.value.code


def pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_control_round_trip_normalises_the_keys():
    req = decode(encode(ControlRequest(session_id="s", event_id=7, keys=["W", "ArrowUp", "w", "j"])))
    assert isinstance(req, ControlRequest) and req.event_id == 7 and req.session_id == "s"
    assert req.keys == ("w", "j", "arrowup")  # lower case, once each, in the table's order
    assert decode(encode(ControlRequest(session_id="s", event_id=8, keys=[]))).keys == ()  # releases all


@pytest.mark.parametrize("obj, expected", [
    ({"keys": ["w", "x"]}, ErrorCode.BAD_MESSAGE),  # an unknown key
    ({"keys": "w"}, ErrorCode.BAD_MESSAGE),  # not a list
    ({"keys": [1]}, ErrorCode.BAD_MESSAGE),
    ({"keys": ["w"] * 33}, ErrorCode.TOO_LARGE),
    ({"event_id": -1}, ErrorCode.BAD_MESSAGE),
    ({"event_id": 1.0}, ErrorCode.BAD_MESSAGE),  # strict int
    ({"event_id": None}, ErrorCode.MISSING_FIELD),  # None: the field left out
    ({"keys": None}, ErrorCode.MISSING_FIELD),
])
def test_bad_controls_get_typed_errors(obj, expected):
    fields = {k: v for k, v in {"endpoint": "control", "session_id": "s", "event_id": 1, "keys": ["w"],
                                **obj}.items() if v is not None}
    err = pytest.raises(ProtocolError, decode, pack(fields)).value
    assert err.code is expected and err.session_id == "s"
    if obj.get("keys") == ["w", "x"]:
        assert "'x'" not in err.message  # names the valid keys, never quotes the input


def test_infer_takes_cameras_or_from_keys():
    req = decode(encode(infer_request("s", from_keys=True)))
    assert isinstance(req, InferRequest) and req.from_keys and req.cameras is None
    assert code(pack({"session_id": "s"})) is ErrorCode.MISSING_FIELD  # neither: as before
    eye = np.eye(4, dtype=np.float32)[None]
    both = {"session_id": "s", "from_keys": True, "cameras": {"poses": eye, "intrinsics": [[1.0, 1, 1, 1]]}}
    assert code(msgpack.packb(both, default=lambda a: a.tolist())) is ErrorCode.BAD_MESSAGE
    assert code(pack({"session_id": "s", "from_keys": 1})) is ErrorCode.BAD_MESSAGE  # strict bool
    assert code(pack({"session_id": "s", "from_keys": False})) is ErrorCode.MISSING_FIELD


def test_frame_reply_carries_event_id_and_poses():
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 2, 3] = np.arange(12) * 0.05
    reply = FrameReply(session_id="s", chunk_id=1, video=b"v", num_frames=12, resolution=(32, 48), event_id=3,
                       poses=poses)
    back = decode_reply(encode(reply))
    assert back.event_id == 3 and back.poses.dtype == np.float32
    np.testing.assert_array_equal(back.poses, poses)
    old = decode_reply(encode(FrameReply(session_id="s", chunk_id=0, video=b"v", num_frames=9, resolution=(32, 48))))
    assert old.event_id is None and old.poses is None  # both optional
    with pytest.raises(ProtocolError):
        decode_reply(encode(reply.model_copy(update={"poses": np.zeros((2, 3), np.float32)})))
