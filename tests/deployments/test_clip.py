"""Clip mode pieces without a server: which requests switch a connection to it, and how a
clip's chunks become the peers' frame messages."""
from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest

from deployments.ingress.peers import CLIP_MODE, PeerTransport
from deployments.ingress.peers.peer import DEFAULT_SESSION, is_peer_request, read_call
from deployments.ingress.peers.replies import ClipFrames
from protocol.codec import unpack
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS
from protocol.codec import encode
from protocol.messages import ResetRequest
from protocol.requests import SessionStart, infer_request


def _openpi(a: np.ndarray) -> dict:
    return {b"__ndarray__": True, b"data": a.tobytes(), b"dtype": a.dtype.str, b"shape": list(a.shape)}


def _camera(n: int) -> dict:
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], n, axis=0)
    intr = np.tile(np.array([500, 500, 416, 240], np.float32), (n, 1))
    return {"poses": _openpi(poses), "intrinsics": _openpi(intr)}


def _png() -> bytes:
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (64, 36), (90, 120, 150)).save(buf, format="PNG")
    return buf.getvalue()


def test_our_requests_stay_in_our_protocol():
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 12, axis=0)
    ours = encode(infer_request("s", poses, np.tile(np.array([500, 500, 416, 240], np.float32), (12, 1)),
                                start=SessionStart(np.zeros((32, 32, 3), np.uint8), "p")))
    assert not is_peer_request(unpack(ours))
    assert not is_peer_request(unpack(encode(ResetRequest(session_id="s"))))


@pytest.mark.parametrize("request_", [
    {"prompt": "p", "camera": _camera(24), "extra_body": {"height": 32}, "session_id": "s"},  # extra_body
    {"prompt": "p", "camera": _camera(12), "session_id": None},  # nil session_id
    {"prompt": "p", "camera": _camera(81), "session_id": "s"},  # more poses than one chunk
    {"endpoint": "reset"},  # a reset naming no session
])
def test_the_peers_requests_are_recognised(request_):
    assert is_peer_request(unpack(msgpack.packb(request_, use_bin_type=True)))


def test_extra_body_maps_to_session_options():
    call = read_call(unpack(msgpack.packb({
        "prompt": "p", "camera": _camera(24), "session_id": None,
        "extra_body": {"height": 480, "width": 832, "num_frames": 25, "fps": 16, "seed": 3, "frames_per_chunk": 6},
    }, use_bin_type=True)))
    assert (call.session_id, call.size, call.seed, call.num_frames, call.frames_per_message) == (
        DEFAULT_SESSION, "480*832", 3, 25, 6)
    assert call.poses.shape == (24, 4, 4) and call.intrinsics.shape == (24, 4)


def test_height_without_width_is_refused():
    with pytest.raises(ProtocolError):
        read_call({"prompt": "p", "camera": _camera(12), "extra_body": {"height": 32}})


def test_chunks_become_messages_of_frames_per_chunk_as_they_decode():
    clip = ClipFrames(chunks=2, frames=21, per_message=4)
    assert clip.total == 6
    first = clip.add(np.zeros((9, 2, 2, 3), np.float32))
    assert len(first) == 2  # 8 frames out, 1 held for the next chunk
    rest = clip.add(np.ones((12, 2, 2, 3), np.float32))
    messages = [msgpack.unpackb(m) for m in first + rest]
    assert [m["index"] for m in messages] == list(range(6))
    assert all(m["total"] == 6 for m in messages)
    assert [m["video"][b"shape"] for m in messages] == [[4, 2, 2, 3]] * 5 + [[1, 2, 2, 3]]


class _Socket:
    """The part of Starlette's WebSocket that PeerTransport reads: one frame, then a disconnect."""

    application_state = None

    def __init__(self, data: bytes) -> None:
        self._frames = [{"type": "websocket.receive", "bytes": data}, {"type": "websocket.disconnect", "code": 1000}]

    async def receive(self) -> dict:
        return self._frames.pop(0)


def _refusal(request_: dict, limits=DEFAULT_LIMITS, one_reply: bool = False) -> ProtocolError:
    """What PeerTransport makes of one peer frame it must refuse: the error it answers with."""
    async def go():
        transport = PeerTransport(_Socket(msgpack.packb(request_, use_bin_type=True)), limits, 2, CLIP_MODE,
                                  one_reply=one_reply)
        msg = await asyncio.wait_for(transport.receive(), 10)
        assert msg["bytes"] == b"\xc1", "a refused peer frame reaches the Connection as one undecodable byte"
        return transport._expect[0].error
    return asyncio.run(go())


def test_poses_of_an_impossible_shape_are_refused_with_a_typed_error():
    huge = {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [2 ** 62, 2 ** 62, 0]}
    error = _refusal({"prompt": "p", "camera": {"poses": huge, "intrinsics": _camera(1)["intrinsics"]},
                      "session_id": None})
    assert error.code is ErrorCode.BAD_CAMERAS and "camera.poses" in error.message


def test_a_prompt_nested_1000_deep_is_refused_with_a_typed_error():
    prompt: object = "p"
    for _ in range(1000):
        prompt = [prompt]
    error = _refusal({"prompt": prompt, "camera": _camera(12), "session_id": None, "image": b"x"})
    assert error.code is ErrorCode.BAD_MESSAGE and "`prompt` must be a string" in error.message


def test_a_message_that_could_pass_its_byte_bound_is_refused_so_a_clip_is_never_buffered_whole():
    """A clip's frames wait in the ingress until a message is full: `frames_per_chunk` of 1e9
    with a 4093-pose clip would buffer the whole clip (~19.6 GB at 464x832). Refused with
    too_large when min(frames_per_chunk, the clip's frames) could pass MESSAGE_MAX_BYTES at the
    largest output size; openpi's "all frames in one message" for a short clip still works."""
    from dataclasses import replace

    from deployments.ingress.peers.replies import MESSAGE_MAX_BYTES
    limits = replace(DEFAULT_LIMITS, max_output_area=480 * 832)
    most = MESSAGE_MAX_BYTES // (480 * 832 * 3 * 4)  # 268 frames
    request_ = {"prompt": "p", "camera": _camera(4093), "session_id": None, "image": _png(),
                "extra_body": {"frames_per_chunk": 10 ** 9}}
    error = _refusal(request_, limits)
    assert error.code is ErrorCode.TOO_LARGE and f"at most {most}" in error.message
    with pytest.raises(AssertionError):  # 21 frames in one message (openpi's way): nothing refused
        _refusal({**request_, "camera": _camera(24)}, limits)
    assert read_call({"prompt": "p", "camera": _camera(24), "extra_body": {"frames_per_chunk": 21}}).frames_per_message == 21


def test_the_openpi_route_refuses_a_clip_too_large_for_one_reply():
    """The root (openpi) route answers a clip in one message, buffered whole in the ingress: a
    clip whose frames could pass MESSAGE_MAX_BYTES at the largest output size is too_large."""
    from dataclasses import replace

    from deployments.ingress.peers.replies import MESSAGE_MAX_BYTES
    limits = replace(DEFAULT_LIMITS, max_output_area=480 * 832)
    most = MESSAGE_MAX_BYTES // (480 * 832 * 3 * 4)  # 268 frames
    request_ = {"prompt": "p", "camera": _camera(4093), "session_id": None, "image": _png()}
    error = _refusal(request_, limits, one_reply=True)
    assert error.code is ErrorCode.TOO_LARGE and f"at most {most}" in error.message
    small = {**request_, "camera": _camera(12 * (most // 12) - 3)}  # the most whole chunks that fit
    with pytest.raises(AssertionError):  # nothing refused: the frame reaches the Connection as infers
        _refusal(small, limits, one_reply=True)
