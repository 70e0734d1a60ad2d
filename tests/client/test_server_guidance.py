"""What the served app tells a newcomer (issue 48), through Ray Serve's proxy: the handshake and
/v1/models say the embedded model's weights are random, the ingress logs where to go once up,
and a wrong route, method, WebSocket path, upload or frame count is answered with what to do."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from client.cli import main
from protocol.codec import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply
from support import EXAMPLES

READY_WAIT_S = 60.0


def test_the_handshake_and_the_model_card_say_the_weights_are_random(served):
    with connect(served.ws) as ws:
        config = decode_reply(ws.recv())
    assert isinstance(config, CameraServerConfig)
    assert config.random_weights is True and config.checkpoint is None
    assert config.max_output_area == 1280 * 720  # the served app's default limit, for the page's sizes
    card = requests.get(f"{served.http}/v1/models", timeout=30).json()["data"][0]
    assert card["random_weights"] is True and card["checkpoint"] is None


def test_the_ingress_logs_where_to_open_the_page(served):
    from ray._private.worker import _global_node

    logs = Path(_global_node.get_session_dir_path()) / "logs" / "serve"
    line = f"ready: open {served.http}/ (camera WebSocket {served.ws})"
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        found = [p for p in logs.glob("replica_*WorldIngress*.log") if line in p.read_text(errors="replace")]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(found) == 1, f"no ingress log in {logs} holds {line!r}"
    assert found[0].read_text(errors="replace").count("ready: open") == 1  # once


def test_a_websocket_to_a_wrong_path_is_told_the_camera_route(served):
    """Through the proxy (not a bare HTTP 403): accepted, an error naming the route, closed 1008."""
    with connect(served.ws.rsplit("/", 1)[0]) as ws:  # /v1/realtime/world
        reply = decode_reply(ws.recv())
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BAD_MESSAGE
        assert "connect to /v1/realtime/world/camera (docs/PROTOCOL.md)" in reply.message
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd.code == 1008 and "/v1/realtime/world/camera" in closed.value.rcvd.reason


def test_get_videos_names_post_and_its_doc(served):
    r = requests.get(f"{served.http}/v1/videos", timeout=30)
    assert r.status_code == 405
    assert "POST /v1/videos" in r.json()["message"] and "docs/VIDEOS.md" in r.json()["message"]
    r = requests.get(f"{served.http}/v1/model", timeout=30)
    assert r.status_code == 404 and "GET /v1/models" in r.json()["message"]


def test_a_multipart_upload_is_told_to_send_json(served):
    """415 since issue 54 (a form or multipart body is what another site's page may post)."""
    image = (EXAMPLES / "00" / "image.jpg").read_bytes()
    r = requests.post(f"{served.http}/v1/videos", files={"image": ("image.jpg", image, "image/jpeg")},
                      data={"prompt": "a walk"}, timeout=60)
    assert (r.status_code, r.json()["code"]) == (415, "unsupported_media_type")
    assert r.json()["message"].startswith("send JSON (docs/VIDEOS.md) with `Content-Type: application/json`")


def test_too_few_frames_are_said_in_frames(served, tmp_path, capsys):
    code = main(["orbit", "--url", served.ws, "--frames", "5", "--out", str(tmp_path / "o.mp4")])
    err = capsys.readouterr().err
    assert code != 0 and "a video has 9 + 12k frames (9, 21, 33, ...); ask for at least 9" in err
    assert "latent" not in err
