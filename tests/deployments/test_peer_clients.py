"""The peers' clients against the served app (issue 16, docs/COMPATIBILITY.md).

`OmniClient` reproduces, message by message, what vllm-omni's example client
(examples/online_serving/lingbot_world_fast/openai_client.py, PR #3701) sends and reads:
one socket per call, the handshake read and ignored, one request with the clip's whole
trajectory (`camera`, openpi `__ndarray__` arrays, a raw RGB image on the first call only,
`extra_body`, a nil `session_id`), then `{type: frame, index, total, video}` messages until
`total`. It is written here from their wire behaviour, with openpi-client's own encoder.

The frames must be the very frames our protocol's session H.264-encodes for the same
trajectory and seed: muxed again with our muxer, they give its fMP4 bytes exactly.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import numpy as np
import pytest
import websockets.sync.client as ws_sync

from camera.frames import FPS
from camera.plan import plan_session
from media.fmp4 import Fmp4Muxer
from protocol import decode_reply
from protocol.messages import CameraServerConfig, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")  # scripts/setup.sh installs it

HEIGHT, WIDTH = 32, 64  # their --height/--width; with the example's 16:9 image: 32 x 48 frames
SEED = 7
PEER_KEY = "key-peers"  # one of conftest.API_KEYS, used by no other test


class PeerError(RuntimeError):
    """What their client raises on `{type: error}`."""

    def __init__(self, msg: dict) -> None:
        super().__init__(f"Server error: {msg.get('message')}")
        self.msg = msg


def omni_call(url: str, request: dict) -> list[np.ndarray]:
    """One call of their client: a new socket, the handshake, one request, frames until `total`."""
    with ws_sync.connect(url, max_size=None, ping_interval=None, ping_timeout=None) as ws:
        msgpack_numpy.unpackb(ws.recv())  # the handshake, ignored
        ws.send(msgpack_numpy.packb(request))
        chunks, total, indices = [], None, []
        while total is None or len(chunks) < total:
            msg = msgpack_numpy.unpackb(ws.recv(timeout=300))
            if isinstance(msg, dict) and msg.get("type") == "error":
                raise PeerError(msg)
            if not isinstance(msg, dict) or msg.get("type") != "frame":
                continue
            total = msg["total"]
            indices.append(msg["index"])
            chunks.append(msg["video"])
        assert indices == list(range(total))
        return chunks


def omni_request(example, start: int, n: int, first: bool, **extra) -> dict:
    """Their request for poses[start:start+n] (num_frames 4n+1 on the first call, as they send)."""
    body = {"height": HEIGHT, "width": WIDTH, "num_frames": (n // 4) * 4 + (1 if first else 0), "fps": FPS,
            "session_id": None, **extra}
    request = {"prompt": example.prompt, "extra_body": body,
               "camera": {"poses": example.poses[start:start + n], "intrinsics": example.intrinsics[start:start + n]}}
    if first:
        request["image"] = example.image_rgb()
    request["session_id"] = None
    return request


def our_chunks(server, example, n: int, seed: int) -> list[bytes]:
    """Our protocol's fMP4 chunks for the same trajectory and options as a first clip of n poses."""
    plan = plan_session(example.poses[:n], example.intrinsics[:n], n)
    with ws_sync.connect(server.ws, max_size=None) as ws:
        assert isinstance(decode_reply(ws.recv()), CameraServerConfig)
        replies = []
        for k, poses in enumerate(plan.chunk_poses):  # one chunk in flight at a time
            start = SessionStart(example.image, example.prompt, seed=seed, size=f"{HEIGHT}*{WIDTH}",
                                 translation_scale=plan.translation_scale) if k == 0 else None
            ws.send(encode(infer_request("ours", poses, plan.chunk_intrinsics(k), start=start)))
            replies.append(decode_reply(ws.recv(timeout=300)))
    assert all(isinstance(r, FrameReply) for r in replies), replies
    return [r.video for r in replies]


def remux(frames: np.ndarray, chunk_frames: list[int]) -> list[bytes]:
    """Float frames in [0, 1] back to uint8, muxed chunk by chunk as the VAE deployment does."""
    rgb = np.rint(frames * 255.0).astype(np.uint8)
    assert np.array_equal(rgb.astype(np.float32) / np.float32(255.0), frames)  # exactly k / 255
    muxer = Fmp4Muxer(rgb.shape[2], rgb.shape[1], FPS)
    out, i = [], 0
    for n in chunk_frames:
        out.append(muxer.add_chunk(rgb[i:i + n]))
        i += n
    return out


def check_format(chunks: list[np.ndarray], per_message: int) -> np.ndarray:
    for c in chunks[:-1]:
        assert c.shape[0] == per_message
    clip = np.concatenate(chunks)
    assert clip.dtype == np.float32 and clip.shape[1:] == (HEIGHT, 48, 3)
    assert 0.0 <= clip.min() and clip.max() <= 1.0
    return clip


@pytest.mark.parametrize("n, frames", [(24, 21), (81, 81)])
def test_their_client_gets_our_vae_frames(server, example, n, frames):
    """A 24-pose clip runs as 2 chunks (21 frames: 9 + 12), an 81-pose one as 7 (81 frames);
    4 frames a message; the frames are those our protocol's session encodes to H.264."""
    chunks = omni_call(server.ws, omni_request(example, 0, n, first=True, seed=np.int64(SEED)))
    assert len(chunks) == -(-frames // 4)
    clip = check_format(chunks, 4)
    assert len(clip) == frames
    ours = our_chunks(server, example, n, SEED)
    assert remux(clip, [9] + [12] * (len(ours) - 1)) == ours


def test_frames_per_chunk_sets_the_frames_per_message(server, example):
    chunks = omni_call(server.ws, omni_request(example, 0, 24, first=True, frames_per_chunk=5))
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 1]


def test_their_extension_call_on_a_new_socket_is_refused_when_resume_is_off(server, example):
    """On an app whose sessions end with their socket (resume_grace_s 0), their second call on a
    new socket, without image, gets a typed session_lost error that says so."""
    omni_call(server.ws, omni_request(example, 0, 24, first=True))
    with pytest.raises(PeerError) as e:
        omni_call(server.ws, omni_request(example, 24, 24, first=False))
    assert e.value.msg["code"] == "session_lost" and "resume" in e.value.msg["message"]


def test_their_extension_call_on_a_new_socket_continues_the_session(resume_server, example):
    """Their default flow (`--num-calls 2`): the second call opens a new socket and sends the
    next poses without image; the parked clip session (claimed by client and session id, no
    token) continues, with the very frames of an extension on one socket."""
    with ws_sync.connect(resume_server.ws, max_size=None) as ws:  # the reference: both calls on one socket
        msgpack_numpy.unpackb(ws.recv())
        ws.send(msgpack_numpy.packb(omni_request(example, 0, 24, first=True)))
        first_ref = np.concatenate(_frames(ws))
        ws.send(msgpack_numpy.packb(omni_request(example, 21, 24, first=False)))
        extension_ref = np.concatenate(_frames(ws))
    first = np.concatenate(omni_call(resume_server.ws, omni_request(example, 0, 24, first=True)))
    extension = np.concatenate(omni_call(resume_server.ws, omni_request(example, 21, 24, first=False)))
    assert first.shape == (21, HEIGHT, 48, 3) and extension.shape == (24, HEIGHT, 48, 3)
    assert np.array_equal(first, first_ref) and np.array_equal(extension, extension_ref)
    resume_server.wait_held(0, timeout=30)


def _frames(ws) -> list[np.ndarray]:
    chunks, total = [], None
    while total is None or len(chunks) < total:
        msg = msgpack_numpy.unpackb(ws.recv(timeout=300))
        assert msg["type"] == "frame", msg
        total = msg["total"]
        chunks.append(msg["video"])
    return chunks


def test_extension_and_reset_on_one_socket(server, example):
    """On one socket an extension clip continues the session (12 frames per 12 poses); a reset
    naming no session resets it and is answered with their text; a clip without image then
    has no session to continue."""
    with ws_sync.connect(server.ws + "/", max_size=None) as ws:  # the trailing slash too
        msgpack_numpy.unpackb(ws.recv())
        ws.send(msgpack_numpy.packb({"endpoint": "reset"}))
        assert ws.recv(timeout=60) == "reset successful"  # nothing open yet: still their text
        ws.send(msgpack_numpy.packb(omni_request(example, 0, 24, first=True)))
        assert sum(len(c) for c in _frames(ws)) == 21
        ws.send(msgpack_numpy.packb(omni_request(example, 21, 24, first=False)))
        extension = np.concatenate(_frames(ws))
        assert extension.shape == (24, HEIGHT, 48, 3)
        ws.send(msgpack_numpy.packb({"endpoint": "reset"}))
        assert ws.recv(timeout=60) == "reset successful"
        ws.send(msgpack_numpy.packb(omni_request(example, 45, 24, first=False)))
        msg = msgpack_numpy.unpackb(ws.recv(timeout=60))
        assert msg["type"] == "error" and msg["code"] == "session_lost"


def test_openpi_websocket_client_policy_drives_a_session(server, example):
    """openpi-client's WebsocketClientPolicy: metadata = our handshake; each `infer` reads one
    message, so the clips ask for all their frames in one (`frames_per_chunk`)."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    policy = WebsocketClientPolicy(host=server.ws + "?mode=clip")
    assert policy.get_server_metadata()["type"] == "config"
    first = omni_request(example, 0, 24, first=True, frames_per_chunk=21)
    first["session_id"] = "robot-1"
    out = policy.infer(first)
    assert out["type"] == "frame" and out["total"] == 1 and out["video"].shape == (21, HEIGHT, 48, 3)
    second = omni_request(example, 21, 12, first=False, frames_per_chunk=12)
    second["session_id"] = "robot-1"
    out = policy.infer(second)
    assert out["index"] == 0 and out["video"].shape == (12, HEIGHT, 48, 3)
    assert 0.0 <= out["video"].min() and out["video"].max() <= 1.0


def test_openpi_client_as_documented_connects_to_the_root_and_gets_one_reply_per_clip(server, example):
    """openpi's documented call, `WebsocketClientPolicy(host, port)`, connects to
    `ws://host:port` (no path). There each `infer()` (one send, one receive) gets its whole
    clip in one message, whatever `frames_per_chunk` says: the second `infer()` gets the second
    clip (the session's extension, the frames the camera route's clip mode gives on one
    socket), not a left-over message of the first. A reset is answered with a map, as is an
    error."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    with ws_sync.connect(server.ws, max_size=None) as ws:  # the reference: the clip mode on the camera route
        msgpack_numpy.unpackb(ws.recv())
        ws.send(msgpack_numpy.packb(omni_request(example, 0, 24, first=True)))
        first_ref = np.concatenate(_frames(ws))
        ws.send(msgpack_numpy.packb(omni_request(example, 21, 24, first=False)))
        extension_ref = np.concatenate(_frames(ws))

    url = urlsplit(server.http)
    policy = WebsocketClientPolicy(url.hostname, url.port)
    try:
        assert policy.get_server_metadata()["type"] == "config"
        first = policy.infer(omni_request(example, 0, 24, first=True))  # frames_per_chunk 4 by default
        assert (first["type"], first["index"], first["total"]) == ("frame", 0, 1)
        assert np.array_equal(first["video"], first_ref) and first["video"].shape == (21, HEIGHT, 48, 3)
        second = policy.infer(omni_request(example, 21, 24, first=False, frames_per_chunk=5))
        assert (second["type"], second["index"], second["total"]) == ("frame", 0, 1)
        assert np.array_equal(second["video"], extension_ref) and second["video"].shape == (24, HEIGHT, 48, 3)
        assert policy.infer({"endpoint": "reset"}) == {"type": "reset", "message": "reset successful"}
        lost = policy.infer(omni_request(example, 45, 24, first=False))  # nothing left to continue
        assert lost["type"] == "error" and lost["code"] == "session_lost"
        bad = policy.infer({"camera": {"poses": np.zeros((3, 4, 4), np.float32)}})
        assert bad["type"] == "error" and bad["code"] == "missing_field"
        again = policy.infer(omni_request(example, 0, 24, first=True))  # the socket still serves clips
        assert np.array_equal(again["video"], first_ref)
    finally:
        policy._ws.close()
    server.wait_held(0, timeout=30)


def test_openpi_api_key_header_is_accepted(strict_server, example):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    policy = WebsocketClientPolicy(host=strict_server.ws, api_key=PEER_KEY)
    assert policy.get_server_metadata()["type"] == "config"


def test_a_request_just_under_max_message_bytes_runs(server, example):
    """A raw image that makes the frame 11.4 MiB, under max_message_bytes: the proxy reads it
    whole (only frames over the cap are skipped as they arrive, deployments/proxy_guard.py) and
    the clip runs."""
    with ws_sync.connect(server.ws + "?mode=clip", max_size=None) as ws:
        config = msgpack_numpy.unpackb(ws.recv())
        big = omni_request(example, 0, 24, first=True)
        big["image"] = np.zeros((1500, 2660, 3), np.uint8)  # 12.0 MB raw
        frame = msgpack_numpy.packb(big)
        assert 11 * 1024 * 1024 < len(frame) < config["max_message_bytes"]
        ws.send(frame)
        assert sum(len(c) for c in _frames(ws)) == 21


def test_an_oversized_request_gets_a_typed_too_large_and_the_socket_stays_usable(server, example):
    """A request over the server's max_message_bytes (12 MiB, below the proxy's 16 MiB): a raw
    image that makes the frame 13.5 MiB. Their client reads `{type: error, code: too_large}`
    (not a 1009 close), and the same socket then runs a clip."""
    with ws_sync.connect(server.ws + "?mode=clip", max_size=None) as ws:
        config = msgpack_numpy.unpackb(ws.recv())
        big = omni_request(example, 0, 24, first=True)
        big["image"] = np.zeros((1600, 2960, 3), np.uint8)  # 14.2 MB raw
        frame = msgpack_numpy.packb(big)
        assert config["max_message_bytes"] < len(frame) < 16 * 1024 * 1024
        ws.send(frame)
        msg = msgpack_numpy.unpackb(ws.recv(timeout=60))
        assert msg["type"] == "error" and msg["code"] == "too_large", msg
        assert f"at most {config['max_message_bytes']}" in msg["message"], msg
        ws.send(msgpack_numpy.packb(omni_request(example, 0, 24, first=True)))
        assert sum(len(c) for c in _frames(ws)) == 21
