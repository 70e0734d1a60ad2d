"""An unknown route, a wrong method or a WebSocket to a wrong path names the right route and its doc
(deployments/ingress/signposts.py, issue 48), on the ingress's FastAPI app in-process (no Ray
cluster: the routes and handlers are the app's, the class's methods are never called here; the
WebSocket catch-all, a method of the class, on an app of its own). Through Ray Serve's proxy:
tests/client/test_server_guidance.py."""
from __future__ import annotations

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from deployments.ingress.server import app
from deployments.ingress.signposts import answer_wrong_socket, install_signposts, wrong_socket_reason
from protocol.codec import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply


@pytest.fixture(scope="module")
def client():
    return TestClient(app)


def test_get_videos_names_post_and_the_doc(client):
    r = client.get("/v1/videos")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    body = r.json()
    assert body["code"] == "method_not_allowed"
    assert "POST /v1/videos" in body["message"] and "docs/VIDEOS.md" in body["message"]


def test_another_wrong_method_names_the_allowed_one(client):
    r = client.put("/v1/models")
    assert r.status_code == 405 and r.json()["message"] == "PUT /v1/models is not a route: /v1/models takes GET"


def test_an_unknown_route_lists_the_routes(client):
    r = client.get("/v1/video")
    assert r.status_code == 404
    message = r.json()["message"]
    assert message.startswith("no route GET /v1/video on this server")
    for route in ("WebSocket /v1/realtime/world/camera", "docs/PROTOCOL.md", "POST /v1/videos", "GET /v1/models"):
        assert route in message


def test_the_routes_own_errors_pass_through():
    """A 404 or 401 a route raises itself (a job of another client, a missing key) keeps its body."""
    own = FastAPI()

    @own.get("/job")
    async def job() -> None:
        raise HTTPException(404, "no job x on this replica")

    install_signposts(own)
    r = TestClient(own).get("/job")
    assert r.status_code == 404 and r.json() == {"detail": "no job x on this replica"}
    assert TestClient(own).get("/jobs").json()["code"] == "not_found"


def test_a_websocket_to_a_wrong_path_is_told_the_camera_route():
    own = FastAPI()
    own.add_api_websocket_route("/{path:path}", answer_wrong_socket)  # as the ingress class's last route
    with TestClient(own).websocket_connect("/v1/realtime/world") as ws:
        reply = decode_reply(ws.receive_bytes())
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BAD_MESSAGE
        assert reply.message == ("no WebSocket at /v1/realtime/world: connect to /v1/realtime/world/camera "
                                 "(docs/PROTOCOL.md)")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
    assert closed.value.code == 1008 and closed.value.reason == wrong_socket_reason("")
    assert "/v1/realtime/world/camera" in closed.value.reason


def test_the_close_reason_fits_a_close_frame_behind_a_long_prefix():
    assert len(wrong_socket_reason("/" + "p" * 200).encode()) <= 123
    assert wrong_socket_reason("/lwf") == "no WebSocket here: the camera is /lwf/v1/realtime/world/camera (docs/PROTOCOL.md)"
