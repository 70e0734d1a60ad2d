"""The client against a server that cannot be trusted (issue 54 item 7), scripted without Ray:
silent, `queued` for ever, frames over the handshake's size, replies for sessions the client
did not open, a chunk id out of sequence, junk video. `SyncWorldClient` raises `ReplyTimeout`
or `BadReply` (never a bare ValueError), and `lwf-client` exits 1 with one line and writes
nothing of what it refused."""
from __future__ import annotations

import io
import re
import time
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image

from client import cli
from client.errors import BadReply, ReplyTimeout, ServerError
from client.reply_guard import DEFAULT_REPLY_MAX_BYTES
from client.sync import SyncWorldClient
from media.mp4_boxes import box
from protocol.codec import decode, encode
from protocol.messages import CameraServerConfig, FrameReply, InferRequest, Queued
from protocol.requests import SessionStart
from scripted_server import scripted_server, video
from support import EXAMPLES

BIG_BOX = box(b"free", bytes(3 << 20))  # 3 MiB in a well-formed chunk 0
SMALL = CameraServerConfig(model="scripted", max_message_bytes=1 << 20, max_output_area=32 * 48,
                           image_resolution=(32, 48))  # frames up to 1 MiB + 32x48x3x12 bytes


def frame(sid: str, k: int, req: InferRequest, payload: bytes | None = None) -> bytes:
    return encode(FrameReply(session_id=sid, chunk_id=k, video=video(k, 9 if k == 0 else 12) if payload is None
                             else payload, num_frames=9 if k == 0 else 12, resolution=(32, 48),
                             client_chunk_id=req.client_chunk_id))


def answering(reply: Callable[[InferRequest, int], bytes]) -> Callable:
    """A script answering the n-th infer with reply(request, n); other requests get nothing."""
    def script(ws) -> None:
        n = 0
        for data in ws:
            req = decode(data)
            if isinstance(req, InferRequest):
                ws.send(reply(req, n))
                n += 1
    return script


HOSTILE = {  # name -> (the reply to the first infer, the handshake, what the error says)
    "another session": (lambda req, n: frame("someone-else", 0, req), None, "did not open"),
    "a path for a session id": (lambda req, n: frame("../../x", 0, req), None, "did not open"),
    "chunk id 10^12": (lambda req, n: frame(req.session_id, 10**12, req), None, "at most 341 chunks"),
    "junk video": (lambda req, n: frame(req.session_id, 0, req, b"\x00\x00\x00\x10junk" * 64), None,
                   "not fragmented MP4"),
    "a frame over the handshake's size": (lambda req, n: frame(req.session_id, 0, req, video(0, 9) + BIG_BOX), SMALL,
                                          "over the 1103872 bytes .* without reading it"),  # websockets' max_size
}


def silent(ws) -> None:
    for _ in ws:
        pass


def queued_forever(ws) -> None:
    for data in ws:
        req = decode(data)
        if isinstance(req, InferRequest):
            while True:
                ws.send(encode(Queued(session_id=req.session_id, position=3, eta_s=1.0, queue_token="q" * 32)))
                time.sleep(0.1)


def start_inputs() -> tuple[np.ndarray, np.ndarray, SessionStart]:
    buf = io.BytesIO()
    Image.new("RGB", (64, 36), (90, 120, 150)).save(buf, format="PNG")
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 12, axis=0)
    intrinsics = np.repeat(np.array([[500, 500, 416, 240]], dtype=np.float32), 12, axis=0)
    return poses, intrinsics, SessionStart(buf.getvalue(), "a street")


def cli_run(url: str, tmp_path, capsys, *options: str) -> tuple[int, list[str], object]:
    out = tmp_path / "out.mp4"
    code = cli.main(["play", str(EXAMPLES / "00"), "--url", url, "--frames", "9", "--out", str(out), *options])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error", "server error"))]
    return code, errors, out


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_reply_is_one_typed_error(case):
    reply, handshake, says = HOSTILE[case]
    poses, intrinsics, start = start_inputs()
    with scripted_server(answering(reply), handshake or CameraServerConfig(model="scripted")) as url:
        with SyncWorldClient(url) as c:
            with pytest.raises(BadReply, match=says) as refused:
                c.infer("mine", poses, intrinsics, start=start)
    assert isinstance(refused.value, ServerError) and not isinstance(refused.value, ValueError)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_cli_refuses_a_hostile_reply_in_one_line_and_writes_nothing(case, tmp_path, capsys):
    reply, handshake, says = HOSTILE[case]
    with scripted_server(answering(reply), handshake or CameraServerConfig(model="scripted")) as url:
        code, errors, out = cli_run(url, tmp_path, capsys)
    assert code == cli.EXIT_ERROR
    assert len(errors) == 1 and errors[0].startswith("error: refused the server's reply"), errors
    assert re.search(says, errors[0]), errors
    assert not out.exists()


def test_a_chunk_out_of_sequence_is_refused_after_a_good_one():
    poses, intrinsics, start = start_inputs()
    with scripted_server(answering(lambda req, n: frame(req.session_id, 2 * n, req))) as url:
        with SyncWorldClient(url) as c:
            assert c.infer("mine", poses, intrinsics, start=start).chunk_id == 0
            with pytest.raises(BadReply, match="chunk 2 of session 'mine' out of sequence: chunk 1 comes next"):
                c.infer("mine", poses, intrinsics)


def test_a_video_that_does_not_decode_is_a_bad_reply():
    """Well-formed boxes around no H.264: found when the frames are decoded (PyAV's own error before)."""
    poses, intrinsics, start = start_inputs()
    with scripted_server(answering(lambda req, n: frame(req.session_id, 0, req))) as url:
        with SyncWorldClient(url) as c:
            chunk = c.infer("mine", poses, intrinsics, start=start)
    with pytest.raises(BadReply, match="does not decode"):
        chunk.frames


def test_a_first_frame_over_the_default_size_is_refused_before_the_handshake():
    with scripted_server(silent, handshake=b"\x81" + b"\0" * (DEFAULT_REPLY_MAX_BYTES + 1)) as url:
        with pytest.raises(BadReply, match="over the"):
            SyncWorldClient(url)


def test_a_silent_server_times_out(tmp_path, capsys):
    poses, intrinsics, start = start_inputs()
    with scripted_server(silent) as url:
        with SyncWorldClient(url, reply_timeout_s=0.5) as c:
            with pytest.raises(ReplyTimeout, match="no reply from the server within 0.5 s") as timeout:
                c.infer("mine", poses, intrinsics, start=start)
        assert not timeout.value.in_line
        code, errors, out = cli_run(url, tmp_path, capsys, "--timeout", "0.5")
    assert code == cli.EXIT_ERROR and len(errors) == 1, errors
    assert "within 0.5 s" in errors[0] and "--timeout S" in errors[0] and "--queue-timeout" not in errors[0]
    assert not out.exists()


def test_a_line_that_never_moves_times_out_on_its_own_bound(tmp_path, capsys):
    """`queued` every 0.1 s: each within the 1 s reply timeout, the wait ends at the queue's 2.5 s."""
    poses, intrinsics, start = start_inputs()
    with scripted_server(queued_forever) as url:
        with SyncWorldClient(url, reply_timeout_s=1.0, queue_timeout_s=2.5) as c:
            with pytest.raises(ReplyTimeout, match="in the server's line") as timeout:
                c.infer("mine", poses, intrinsics, start=start)
        assert timeout.value.in_line and timeout.value.waited_s >= 2.5
        code, errors, out = cli_run(url, tmp_path, capsys, "--timeout", "1", "--queue-timeout", "2.5")
    assert code == cli.EXIT_ERROR and len(errors) == 1 and "--queue-timeout" in errors[0], errors
    assert not out.exists()


def test_the_timeouts_have_defaults():
    args = cli.parser().parse_args(["orbit"])
    assert (args.timeout, args.queue_timeout) == (300.0, 1800.0)
