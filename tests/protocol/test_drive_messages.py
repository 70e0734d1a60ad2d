"""The wire of server-paced streaming (PROTOCOL.md, `drive`): `drive` validated as a first
infer's opening fields, `ack`, and the `paused` reply."""
from __future__ import annotations

import io

import msgpack
import pytest
from PIL import Image

from protocol import (AckRequest, DriveRequest, ErrorCode, InferRequest, Paused, ProtocolError, decode, decode_reply,
                      encode)
from protocol.messages import require_session_start
from protocol.codec import validated
from protocol.requests import SessionStart, drive_request


def png(w: int = 64, h: int = 36) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


def code(obj: dict) -> ErrorCode:
    with pytest.raises(ProtocolError) as e:
        decode(msgpack.packb(obj, use_bin_type=True))
    return e.value.code


def test_drive_round_trip_stands_for_a_first_infer_from_keys():
    req = decode(encode(drive_request("d", SessionStart(png(), "a street", seed=7, size="32*64", num_frames=33,
                                                        translation_scale=2.0, intrinsics_resolution=(480, 832)))))
    assert isinstance(req, DriveRequest) and req.endpoint == "drive"
    infer = req.as_infer()
    assert isinstance(infer, InferRequest) and infer.from_keys and infer.cameras is None
    assert (infer.session_id, infer.prompt, infer.seed, infer.size, infer.num_frames, infer.translation_scale,
            infer.intrinsics_resolution) == ("d", "a street", 7, "32*64", 33, 2.0, (480, 832))
    assert infer.image is req.image and infer.max_area == 32 * 64
    assert infer.prompt_update is None and infer.resume_token is None


@pytest.mark.parametrize("extra, expected", [
    ({"size": "32x64"}, ErrorCode.BAD_MESSAGE),  # the same checks as a first infer's
    ({"size": "2000*2000"}, ErrorCode.TOO_LARGE),
    ({"num_frames": 32}, ErrorCode.BAD_MESSAGE),
    ({"seed": -1}, ErrorCode.BAD_MESSAGE),
    ({"translation_scale": 0.0}, ErrorCode.BAD_MESSAGE),
    ({"image": b"not an image"}, ErrorCode.BAD_IMAGE),
    ({"prompt": "x" * 5000}, ErrorCode.TOO_LARGE),
    ({"session_id": ""}, ErrorCode.BAD_MESSAGE),
])
def test_bad_drives_get_the_codes_of_a_first_infer(extra, expected):
    assert code({"endpoint": "drive", "session_id": "d", "image": png(), "prompt": "p", **extra}) is expected


def test_a_drive_without_image_or_prompt_cannot_start():
    req = decode(msgpack.packb({"endpoint": "drive", "session_id": "d", "prompt": "p"}))
    with pytest.raises(ProtocolError) as e:
        require_session_start(req.as_infer())
    assert e.value.code is ErrorCode.MISSING_FIELD and "`image`" in e.value.message


def test_ack_round_trip_and_refusals():
    req = decode(encode(AckRequest(session_id="d", chunk_id=4)))
    assert isinstance(req, AckRequest) and (req.session_id, req.chunk_id) == ("d", 4)
    assert code({"endpoint": "ack", "session_id": "d", "chunk_id": -1}) is ErrorCode.BAD_MESSAGE
    assert code({"endpoint": "ack", "session_id": "d", "chunk_id": "4"}) is ErrorCode.BAD_MESSAGE
    assert code({"endpoint": "ack", "session_id": "d"}) is ErrorCode.MISSING_FIELD
    with pytest.raises(ProtocolError):
        validated(AckRequest, {"session_id": "d", "chunk_id": -3})


def test_paused_reply_round_trip():
    reply = decode_reply(encode(Paused(session_id="d", next_chunk_id=5)))
    assert isinstance(reply, Paused) and (reply.session_id, reply.next_chunk_id) == ("d", 5)
