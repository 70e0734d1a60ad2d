"""Message models: round trips of every message type through the codec, model-level rules."""
from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest
from PIL import Image
from scipy.spatial.transform import Rotation

from protocol import (CameraServerConfig, ErrorCode, ErrorReply, FrameReply, InferRequest, ProtocolError, ResetOk,
                      ResetRequest, decode, decode_reply, encode, require_session_start)
from protocol.codec import validated
from protocol.requests import SessionStart, infer_request


def trajectory(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (n, 1, 1))
    poses[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix()
    poses[:, :3, 3] = rng.normal(size=(n, 3))
    intrinsics = np.tile([500.0, 480.0, 416.0, 240.0], (n, 1)) + rng.uniform(0, 5, size=(n, 4))
    return poses, intrinsics


def png(w: int = 64, h: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3)).save(buf, "PNG")
    return buf.getvalue()


def test_infer_round_trip_with_every_field():
    poses, intrinsics = trajectory(12)
    start = SessionStart(png(), "a castle", seed=7, size="480*832", num_frames=81, translation_scale=1.5,
                         intrinsics_resolution=(480, 832))
    data = encode(infer_request("sess-1", poses, intrinsics, start=start, client_chunk_id=3))
    req = decode(data)
    assert isinstance(req, InferRequest) and req.endpoint == "infer" and req.session_id == "sess-1"
    assert req.cameras.poses.dtype == np.float32 and req.cameras.intrinsics.dtype == np.float32
    np.testing.assert_array_equal(req.cameras.poses, poses.astype(np.float32))
    np.testing.assert_array_equal(req.cameras.intrinsics, intrinsics.astype(np.float32))
    assert req.image == png() and req.prompt == "a castle"
    assert (req.seed, req.size, req.intrinsics_resolution, req.num_frames) == (7, "480*832", (480, 832), 81)
    assert (req.translation_scale, req.client_chunk_id, req.max_area) == (1.5, 3, 480 * 832)
    # the wire form is what msgpack_numpy.packb writes: binary keys nd/type/kind/shape/data
    wire = msgpack.unpackb(data, raw=False)
    assert wire["cameras"]["poses"][b"nd"] is True and wire["cameras"]["poses"][b"type"] == "<f4"
    assert wire["cameras"]["poses"][b"shape"] == [12, 4, 4]
    # encode(decode(x)) is stable
    assert encode(req) == data


def test_later_infer_has_only_cameras():
    poses, intrinsics = trajectory(3)
    req = decode(encode(infer_request("s", poses, intrinsics)))
    assert req.image is None and req.prompt is None and req.seed is None and req.max_area is None
    assert set(msgpack.unpackb(encode(req), raw=False)) == {"endpoint", "session_id", "cameras"}
    with pytest.raises(ProtocolError) as e:
        require_session_start(req)
    assert e.value.code is ErrorCode.MISSING_FIELD and "`image` and `prompt`" in e.value.message


def test_an_out_of_range_translation_scale_is_refused_naming_the_value_sent():
    poses, intrinsics = trajectory(3)
    with pytest.raises(ProtocolError) as e:
        validated(InferRequest, {"session_id": "s", "cameras": {"poses": poses, "intrinsics": intrinsics},
                                 "translation_scale": 1e9})
    assert e.value.code is ErrorCode.BAD_MESSAGE
    assert "got 1e+09" in e.value.message and "{" not in e.value.message, e.value.message


def test_require_session_start_accepts_image_and_prompt():
    poses, intrinsics = trajectory(1)
    require_session_start(decode(encode(infer_request("s", poses, intrinsics, start=SessionStart(png(), "")))))
    with pytest.raises(ProtocolError, match="`prompt`"):
        require_session_start(decode(encode(validated(InferRequest, {"session_id": "s", "image": png(), "cameras": {
            "poses": poses, "intrinsics": intrinsics}}))))


def test_raw_image_round_trip():
    poses, intrinsics = trajectory(1)
    rgb = np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    req = decode(encode(infer_request("s", poses, intrinsics, start=SessionStart(rgb, "p"))))
    assert isinstance(req.image, np.ndarray) and req.image.dtype == np.uint8
    np.testing.assert_array_equal(req.image, rgb)


def test_reset_round_trip():
    req = decode(encode(ResetRequest(session_id="abc")))
    assert isinstance(req, ResetRequest) and req.session_id == "abc" and req.endpoint == "reset"
    assert msgpack.unpackb(encode(ResetRequest(session_id="abc")), raw=False) == {"endpoint": "reset",
                                                                                  "session_id": "abc"}


@pytest.mark.parametrize("reply", [
    CameraServerConfig(model="tiny", max_message_bytes=1 << 20),
    FrameReply(session_id="s", chunk_id=0, video=b"\x00\x00\x00\x18ftypisom", num_frames=9, resolution=(464, 832),
               stage_durations={"dit": 1.25, "total": 2.5}, client_chunk_id=4, reset=True,
               mime_type='video/mp4; codecs="avc1.42C01E"', debug={"dit_replica": "r1", "queue": [1, 2]}),
    FrameReply(session_id="s", chunk_id=3, video=b"moof", num_frames=12, resolution=(512, 768)),
    ResetOk(session_id="s"),
    ErrorReply(code=ErrorCode.BAD_CAMERAS, message="fix it", session_id="s"),
    ErrorReply(code=ErrorCode.BUSY, message="full", retry_after_s=2.5),
])
def test_reply_round_trip(reply):
    data = encode(reply)
    wire = msgpack.unpackb(data, raw=False)
    assert wire["type"] == reply.type
    assert None not in wire.values()  # None fields are left out
    assert decode_reply(data) == reply


def test_frame_reply_wire_form():
    wire = msgpack.unpackb(encode(FrameReply(session_id="s", chunk_id=0, video=b"\x01\x02", num_frames=9,
                                             resolution=(464, 832))), raw=False)
    assert wire == {"type": "frame", "session_id": "s", "chunk_id": 0, "video": b"\x01\x02", "num_frames": 9,
                    "resolution": [464, 832], "fps": 16, "stage_durations": {}, "reset": False}


def test_config_defaults_match_protocol():
    wire = msgpack.unpackb(encode(CameraServerConfig(model="lingbot-world-fast")), raw=False)
    assert wire["patch_size"] == [1, 2, 2] and wire["chunk_video_frames"] == 12
    assert wire["first_chunk_video_frames"] == 9 and wire["coordinate_convention"] == "opencv_c2w"
    assert wire["supported_modalities"] == ["camera_pose"] and wire["protocol_version"] == 1
    assert wire["max_message_bytes"] == 12 * 1024 * 1024  # below the proxy's 16 MiB


def test_busy_needs_retry_after_and_only_busy_has_it():
    with pytest.raises(ValueError, match="retry_after_s"):
        ErrorReply(code=ErrorCode.BUSY, message="full")
    with pytest.raises(ValueError, match="retry_after_s"):
        ErrorReply(code=ErrorCode.BAD_IMAGE, message="x", retry_after_s=1.0)


def test_decode_reply_rejects_non_replies():
    with pytest.raises(ProtocolError) as e:
        decode_reply(msgpack.packb({"type": "frame", "session_id": "s"}))
    assert e.value.code is ErrorCode.BAD_MESSAGE
    with pytest.raises(ProtocolError):
        decode_reply(b"\xc1")


def test_models_are_frozen():
    with pytest.raises(ValueError):
        ResetOk(session_id="s").session_id = "t"


def test_direct_construction_validates_cameras():
    poses, intrinsics = trajectory(2)
    poses[1, :3, :3] *= 2.0
    with pytest.raises(ValueError, match="rigid"):
        InferRequest(session_id="s", cameras={"poses": poses, "intrinsics": intrinsics})


def test_json_mode_for_logs():
    poses, intrinsics = trajectory(1)
    req = InferRequest(session_id="s", image=png(16, 16), cameras={"poses": poses, "intrinsics": intrinsics})
    dumped = req.model_dump(mode="json")
    assert dumped["cameras"]["poses"] == poses.astype(np.float32).tolist()
    assert isinstance(dumped["image"], str)  # base64
    reply = FrameReply(session_id="s", chunk_id=0, video=b"\xff\x00", num_frames=1, resolution=(16, 16))
    assert reply.model_dump(mode="json")["video"] == "_wA="
