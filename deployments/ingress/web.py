"""The browser client (the `web` package's static files) served by the ingress: `/` and `/static/...`.

The page talks to the camera WebSocket next to it, so it works behind any route prefix.
`/static/` answers any origin (`Access-Control-Allow-Origin: *`): a page of another site imports
`stream.js` from here as an ES module (a cross-origin module script is fetched in CORS mode) to
show a session in its own <video> (web/README.md, "Embedding"). The files are public code, the
same bytes any client gets; who may stream is decided by the WebSocket's own checks
(`auth.allowed_origins` against the page's `Origin`, API keys), which this does not change.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

WEB_DIR = Path(str(files("web")))
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate: a redeploy must not leave stale scripts
ANY_ORIGIN = {"Access-Control-Allow-Origin": "*"}


class ModuleFiles(StaticFiles):
    """The web client's files, loadable as module scripts by a page of any origin."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(ANY_ORIGIN)
        return response


def mount_web(app: FastAPI) -> None:
    """Serve the page at `/` and its scripts and styles at `/static/` (any origin may load them)."""
    index = WEB_DIR / "index.html"
    if not index.is_file():
        raise ValueError(f"the web client is missing ({index}); reinstall the package with its data files")

    async def web_index() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=NO_CACHE)

    app.add_api_route("/", web_index, methods=["GET"], include_in_schema=False)
    app.mount("/static", ModuleFiles(directory=WEB_DIR), name="static")
