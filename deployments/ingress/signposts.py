"""Where to go instead: an unknown route or a wrong method answers with the right route and its doc.

Starlette's defaults say `{"detail": "Not Found"}` or `"Method Not Allowed"` over HTTP, and close a
WebSocket to an unknown path before the accept, which a browser or a client library reports as
a bare HTTP 403. Here an unknown HTTP route gets a JSON `error` (the shape of the other HTTP
errors, deployments/ingress/videos/errors.py) listing the routes; a wrong method names the
method the route takes (`GET /v1/videos`: make a video with `POST /v1/videos`, docs/VIDEOS.md);
and a WebSocket to an unknown path is accepted, told the camera route in an `error` reply
(msgpack, as on the camera socket) and closed with 1008 and the same hint as its reason.

Paths are named with the app's route prefix (the ASGI `root_path`), so the hints hold behind
`/prefix` too. Errors the routes raise themselves (a 401, a job's 404) pass through unchanged.
"""
from __future__ import annotations

from fastapi import FastAPI, Request, WebSocket
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from deployments.ingress.videos import ROUTE as VIDEOS_ROUTE
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

CAMERA_ROUTE = "/v1/realtime/world/camera"
POLICY_VIOLATION = 1008  # WebSocket close code
# (method, path, what it is); the docs are the repository's
ROUTES = (
    ("GET", "/", "the web page"),
    ("WebSocket", CAMERA_ROUTE, "the live camera session, docs/PROTOCOL.md"),
    ("POST", VIDEOS_ROUTE, "a whole trajectory as one MP4, JSON body, docs/VIDEOS.md"),
    ("GET", "/v1/models", "the model card"),
    ("GET", "/healthz", "health"),
    ("GET", "/docs", "the HTTP API"),
)
# A wrong method on a route users guess: what to send instead.
METHOD_HINTS = {
    VIDEOS_ROUTE: f"make a video with POST {{root}}{VIDEOS_ROUTE} and a JSON body (docs/VIDEOS.md); "
                  f"a job's status is GET {{root}}{VIDEOS_ROUTE}/JOB_ID",
}
DEFAULT_DETAILS = {404: "Not Found", 405: "Method Not Allowed"}


def _root(scope: dict) -> str:
    return scope.get("root_path", "").rstrip("/")


def routes_text(root: str) -> str:
    return "; ".join(f"{method} {root}{path} ({what})" for method, path, what in ROUTES)


def not_found(method: str, path: str, root: str) -> dict:
    return {"type": "error", "code": "not_found",
            "message": f"no route {method} {path} on this server; the routes: {routes_text(root)}"}


def wrong_method(method: str, path: str, root: str, allowed: str) -> dict:
    route = path[len(root):] if root and path.startswith(root) else path
    hint = METHOD_HINTS.get(route.rstrip("/") or "/")
    message = f"{method} {path} is not a route: " + (
        hint.format(root=root) if hint else f"{path} takes {allowed or 'another method'}")
    return {"type": "error", "code": "method_not_allowed", "message": message}


def wrong_socket_reason(root: str) -> str:
    """The close reason (at most 123 bytes) of a WebSocket to an unknown path."""
    return f"no WebSocket here: the camera is {root}{CAMERA_ROUTE} (docs/PROTOCOL.md)"[:123]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if DEFAULT_DETAILS.get(exc.status_code) != exc.detail:  # raised by a route itself: as it was
        return await http_exception_handler(request, exc)
    root = _root(request.scope)
    if exc.status_code == 404:
        body = not_found(request.method, request.url.path, root)
    else:
        body = wrong_method(request.method, request.url.path, root, {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", ""))
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def answer_wrong_socket(ws: WebSocket) -> None:
    """A WebSocket to a path no route takes: told the camera route, then closed."""
    root = _root(ws.scope)
    await ws.accept()
    message = f"no WebSocket at {ws.url.path}: connect to {root}{CAMERA_ROUTE} (docs/PROTOCOL.md)"
    await ws.send_bytes(encode(ErrorReply(code=ErrorCode.BAD_MESSAGE, message=message)))
    await ws.close(code=POLICY_VIOLATION, reason=wrong_socket_reason(root))


def install_signposts(app: FastAPI) -> None:
    """The 404 and 405 answers. Call before `serve.ingress(app)`, which freezes a copy of the app;
    the WebSocket catch-all is the ingress class's last route (it calls `answer_wrong_socket`)."""
    app.add_exception_handler(HTTPException, _http_error)
