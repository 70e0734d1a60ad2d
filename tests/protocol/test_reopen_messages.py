"""`reopen` and `world_changed` on the wire (issue 55 item 3): round trips, typed refusals, and
`world_id` / `changed` only on a `world_changed` error."""
from __future__ import annotations

import msgpack
import pytest
from pydantic import ValidationError

from protocol import ErrorCode, ProtocolError, decode, decode_reply, encode
from protocol.messages import ErrorReply, Reopened, ReopenRequest


def test_reopen_and_reopened_round_trip():
    req = ReopenRequest(session_id="a", world_id="w" + "0" * 24)
    assert decode(encode(req)) == req
    answer = Reopened(session_id="a", world_id="w" + "0" * 24, chunks=3, changed=["model.dtype"])
    assert decode_reply(encode(answer)) == answer
    refused = ErrorReply(code=ErrorCode.WORLD_CHANGED, message="m", session_id="a", world_id="w1", changed=["x"])
    assert decode_reply(encode(refused)) == refused


@pytest.mark.parametrize("fields, code", [
    ({"endpoint": "reopen", "session_id": "a"}, ErrorCode.MISSING_FIELD),
    ({"endpoint": "reopen", "session_id": "a", "world_id": ""}, ErrorCode.BAD_MESSAGE),
    ({"endpoint": "reopen", "session_id": "a", "world_id": 7}, ErrorCode.BAD_MESSAGE),
    ({"endpoint": "reopen", "session_id": "a", "world_id": "w" * 65}, ErrorCode.BAD_MESSAGE),  # as `open`
])
def test_bad_reopen_fields_have_typed_errors(fields, code):
    with pytest.raises(ProtocolError) as e:
        decode(msgpack.packb(fields))
    assert e.value.code is code and "world_id" in e.value.message and e.value.session_id == "a"


def test_world_id_and_changed_come_with_world_changed_only():
    with pytest.raises(ValidationError):
        ErrorReply(code=ErrorCode.WORLD_NOT_FOUND, message="m", world_id="w1")
    with pytest.raises(ValidationError):
        ErrorReply(code=ErrorCode.BAD_MESSAGE, message="m", changed=["model.dtype"])
    with pytest.raises(ValidationError):
        Reopened(session_id="a", world_id="w1", chunks=0)  # a world to reopen has a chunk
