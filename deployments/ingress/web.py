"""The browser client (the `web` package's static files) served by the ingress: `/`, the viewer
page of a shared world at `/w/<world_id>`, and `/static/...`.

The page talks to the camera WebSocket next to it, so it works behind any route prefix.
`/static/` answers any origin (`Access-Control-Allow-Origin: *`): a page of another site imports
`stream.js` from here as an ES module (a cross-origin module script is fetched in CORS mode) to
show a session in its own <video> (web/README.md, "Embedding"). The files are public code, the
same bytes any client gets; who may stream is decided by the WebSocket's own checks
(`auth.allowed_origins` against the page's `Origin`, API keys), which this does not change.

The viewer page is the same file for every world: it reads the world id from its path and the
watch token from the URL's fragment (`#token=...`), which browsers never send, so no token
reaches this route or a log (web/viewer.js). A path that is no world id (ids are url-safe
base64, PROTOCOL.md "share / unshare") is 404.
"""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import PlainTextResponse, Response

from protocol.sharing import MAX_WORLD_ID_CHARS

WEB_DIR = Path(str(files("web")))
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate: a redeploy must not leave stale scripts
ANY_ORIGIN = {"Access-Control-Allow-Origin": "*"}
WORLD_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_WORLD_ID_CHARS}}}")
VIEWER_HEADERS = {**NO_CACHE, "Referrer-Policy": "no-referrer"}


class ModuleFiles(StaticFiles):
    """The web client's files, loadable as module scripts by a page of any origin."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(ANY_ORIGIN)
        return response


def mount_web(app: FastAPI) -> None:
    """Serve the page at `/`, the viewer page at `/w/<world_id>`, and their scripts and styles at
    `/static/` (any origin may load them)."""
    index, viewer = WEB_DIR / "index.html", WEB_DIR / "watch.html"
    for page in (index, viewer):
        if not page.is_file():
            raise ValueError(f"the web client is missing ({page}); reinstall the package with its data files")

    async def web_index() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=NO_CACHE)

    async def web_viewer(world_id: str) -> Response:
        if WORLD_ID.fullmatch(world_id) is None:
            return PlainTextResponse("not a world id: open the link the world's owner shared", status_code=404)
        return FileResponse(viewer, media_type="text/html", headers=VIEWER_HEADERS)

    app.add_api_route("/", web_index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/w/{world_id}", web_viewer, methods=["GET"], include_in_schema=False)
    app.mount("/static", ModuleFiles(directory=WEB_DIR), name="static")
