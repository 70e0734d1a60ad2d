"""One `ready` line per ingress replica, once the app can serve a session: the URL to open.

`serve run` prints the replicas' log lines; a new user waits a minute among them without
knowing when to open which address. The ingress probes the path a session takes (health.py,
the probe `/healthz` runs) until it passes, then logs

    ready: open http://127.0.0.1:8000/ (camera WebSocket ws://127.0.0.1:8000/v1/realtime/world/camera)

with Serve's HTTP address and this app's route prefix, asked from the Serve controller. A
wildcard host (0.0.0.0, ::) is written as 127.0.0.1: the address to open on this machine.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from deployments.log import KeyValueLog

RETRY_S = 3.0
WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


def page_url(root_url: str, route_prefix: Optional[str]) -> str:
    """The web page's URL: Serve's root URL (http://HOST:PORT[/root_path]) + the app's prefix, with a slash."""
    parts = urlsplit(root_url)
    host = parts.hostname or ""
    netloc = parts.netloc
    if host in WILDCARD_HOSTS or f"[{host}]" in WILDCARD_HOSTS:
        netloc = f"127.0.0.1:{parts.port}" if parts.port else "127.0.0.1"
    path = parts.path.rstrip("/") + "/" + (route_prefix or "/").strip("/")
    return urlunsplit((parts.scheme or "http", netloc, path.rstrip("/") + "/", "", ""))


def ready_line(url: str, camera_route: str) -> str:
    ws = "ws" + url[len("http"):] if url.startswith("http") else url
    return f"ready: open {url} (camera WebSocket {ws.rstrip('/')}{camera_route})"


def _serve_address() -> tuple[str, Optional[str]]:
    """(root URL, this app's route prefix) from the Serve controller (blocking: run in a thread)."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    app = serve.get_replica_context().app_name
    details = ray.get(client._controller.get_serve_instance_details.remote())  # noqa: SLF001 - no public API
    return client.root_url, details.get("applications", {}).get(app, {}).get("route_prefix")


async def announce_when_ready(probe: Any, camera_route: str, log: KeyValueLog) -> None:
    """Probe until a session's path answers, then log the ready line once."""
    while True:
        try:
            await probe.run()
            break
        except Exception:  # noqa: BLE001 - not ready yet (a replica still loading or warming up)
            await asyncio.sleep(RETRY_S)
    try:
        root, prefix = await asyncio.to_thread(_serve_address)
    except Exception as e:  # noqa: BLE001 - the line is a courtesy: never fail the replica for it
        log.info(f"ready (the address is unknown here: {type(e).__name__}: {e})")
        return
    log.info(ready_line(page_url(root, prefix), camera_route))
