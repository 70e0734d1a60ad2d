"""The browser client (the `web` package's static files) served by the ingress: `/` and `/static/...`.

The page talks to the camera WebSocket next to it, so it works behind any route prefix.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(str(files("web")))
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate: a redeploy must not leave stale scripts


def mount_web(app: FastAPI) -> None:
    """Serve the page at `/` and its scripts and styles at `/static/`."""
    index = WEB_DIR / "index.html"
    if not index.is_file():
        raise ValueError(f"the web client is missing ({index}); reinstall the package with its data files")

    async def web_index() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=NO_CACHE)

    app.add_api_route("/", web_index, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
