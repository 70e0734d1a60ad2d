"""The committed docs/protocol.schema.json: a valid 2020-12 schema that accepts real messages and
rejects broken ones, and what `python -m protocol.schema` writes today (not stale)."""
from __future__ import annotations

import io
import json

import jsonschema
import numpy as np
import pytest

from PIL import Image

from protocol import CameraServerConfig, ErrorCode, ErrorReply, FrameReply, InferRequest, ResetOk, ResetRequest
from protocol.schema import DEFAULT_PATH, main

COMMITTED = json.loads(DEFAULT_PATH.read_text(encoding="utf-8"))  # what clients of the docs read
VALIDATOR = jsonschema.Draft202012Validator(COMMITTED)


def as_json(message) -> dict:
    """The JSON view of a message (bytes -> a placeholder string, arrays -> nested lists)."""
    obj = message.model_dump(mode="python", exclude_none=True)

    def convert(v):
        if isinstance(v, bytes):
            return "<binary>"
        if isinstance(v, np.ndarray):
            return v.tolist()
        if isinstance(v, dict):
            return {k: convert(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [convert(x) for x in v]
        return v.value if isinstance(v, ErrorCode) else v

    return convert(obj)


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "PNG")
    return buf.getvalue()


MESSAGES = [
    InferRequest(session_id="s", image=png(), prompt="p", seed=1, size="480*832", num_frames=81,
                 cameras={"poses": np.eye(4)[None], "intrinsics": [[500.0, 500.0, 416.0, 240.0]]}),
    ResetRequest(session_id="s"),
    CameraServerConfig(model="tiny"),
    FrameReply(session_id="s", chunk_id=0, video=b"mp4", num_frames=9, resolution=(464, 832),
               stage_durations={"dit": 1.0}, debug={"replica": "a"}),
    ResetOk(session_id="s"),
    ErrorReply(code=ErrorCode.BUSY, message="m", retry_after_s=1.0),
]


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(COMMITTED)
    assert set(COMMITTED["$defs"]) >= {"InferRequest", "ResetRequest", "CameraServerConfig", "FrameReply",
                                    "ResetOk", "ErrorReply", "Cameras", "ErrorCode"}


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_real_messages_validate(message):
    VALIDATOR.validate(as_json(message))


@pytest.mark.parametrize("broken", [
    {"type": "frame", "session_id": "s"},  # missing fields
    {"type": "error", "code": "teapot", "message": "m"},  # unknown code
    {"endpoint": "infer", "session_id": "s", "cameras": {"poses": [[[1, 0, 0, 0]]], "intrinsics": [[1, 1, 1, 1]]}},
    {"type": "reset_ok"},
])
def test_broken_messages_do_not_validate(broken):
    assert not VALIDATOR.is_valid(broken)


def test_committed_schema_is_current(tmp_path):
    main([str(tmp_path / "schema.json")])
    assert json.loads((tmp_path / "schema.json").read_text()) == COMMITTED, "stale: run `python -m protocol.schema`"
