"""`fork` and `rewind` on the wire (issue 33): round trips, replies, and typed refusals."""
from __future__ import annotations

import msgpack
import pytest

from protocol import (ErrorCode, Forked, ForkRequest, ProtocolError, Rewound, RewindRequest, decode, decode_reply,
                      encode)


def test_fork_and_rewind_round_trip():
    fork = ForkRequest(session_id="a", new_session_id="b", at_chunk=3)
    assert decode(encode(fork)) == fork
    assert decode(encode(RewindRequest(session_id="a", to_chunk=0))) == RewindRequest(session_id="a", to_chunk=0)
    assert decode_reply(encode(Forked(session_id="b", parent_session_id="a", next_chunk_id=3))).type == "forked"
    assert decode_reply(encode(Rewound(session_id="a", next_chunk_id=0))) == Rewound(session_id="a", next_chunk_id=0)


@pytest.mark.parametrize("fields, code, names", [
    ({"endpoint": "fork", "session_id": "a", "new_session_id": "b", "at_chunk": 0}, ErrorCode.BAD_MESSAGE, "at_chunk"),
    ({"endpoint": "fork", "session_id": "a", "new_session_id": "b", "at_chunk": 342}, ErrorCode.BAD_MESSAGE, "at_chunk"),
    ({"endpoint": "fork", "session_id": "a", "new_session_id": "b", "at_chunk": "1"}, ErrorCode.BAD_MESSAGE, "at_chunk"),
    ({"endpoint": "fork", "session_id": "a", "at_chunk": 1}, ErrorCode.MISSING_FIELD, "new_session_id"),
    ({"endpoint": "fork", "session_id": "a", "new_session_id": "", "at_chunk": 1}, ErrorCode.BAD_MESSAGE,
     "new_session_id"),
    ({"endpoint": "fork", "session_id": "a", "new_session_id": "x" * 129, "at_chunk": 1}, ErrorCode.TOO_LARGE,
     "new_session_id"),
    ({"endpoint": "rewind", "session_id": "a", "to_chunk": -1}, ErrorCode.BAD_MESSAGE, "to_chunk"),
    ({"endpoint": "rewind", "session_id": "a"}, ErrorCode.MISSING_FIELD, "to_chunk"),
])
def test_bad_fork_and_rewind_fields_have_typed_errors(fields, code, names):
    with pytest.raises(ProtocolError) as e:
        decode(msgpack.packb(fields))
    assert e.value.code is code and names in e.value.message
    assert e.value.session_id == "a"  # the error reply names the session
