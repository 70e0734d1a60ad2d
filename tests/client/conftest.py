"""One served app for the tests of tests/client that need a server.

It serves the embedded tiny model on CPU (one replica per deployment) with the web page and
/v1/videos mounted by the ingress. Ray starts once (~15 s on 2 cores) at the first test that
asks for `served` and stops when the run leaves tests/client, so that other test folders
can start their own cluster afterwards. Beside it, web/examples/ is served on a port of its
own (another origin), bound before the app starts so that its `auth.allowed_origins` names it.
"""
from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES_DIR = HERE.parents[1] / "web" / "examples"
TEST_SIZE = "32*64"  # a 16:9 image -> 32 x 48 output; 480x832 -> 32 x 48
CAMERA_PATH = "/v1/realtime/world/camera"
APP_ARGS = {
    "model": {"preset": "tiny", "default_size": TEST_SIZE},
    # A page closed without a reset parks its session: for 5 s here, not the default 60 s.
    "sessions": {"max_sessions": 2, "retry_after_s": 1.0, "routing_stats_period_s": 0.5, "resume": {"grace_s": 5.0}},
    "dit": {"num_cpus": 0.1},
    "vae": {"num_cpus": 0.1},
    "text_encoder": {"num_cpus": 0.1},
    "ingress": {"num_cpus": 0.1, "max_ongoing_requests": 64},
    "videos": {"max_body_mib": 4, "max_jobs": 1},  # test_videos.py: the body cap and the job bound
    # test_web_worlds.py: the page's Save and My worlds; the folder is made when the app starts
    "worlds": {"enabled": True},
}
STARTUP_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Served:
    http: str  # http://127.0.0.1:PORT
    ws: str  # ws://127.0.0.1:PORT/v1/realtime/world/camera
    examples: str  # http://127.0.0.1:OTHER: web/examples/, an origin the app allows (auth.allowed_origins)


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


_running: dict[str, Any] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start() -> Served:
    import ray
    import requests
    from ray import serve

    from deployments.app import build_app
    from deployments.config import AppArgs

    port = _free_port()
    files = _running["files"] = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietFiles, directory=str(EXAMPLES_DIR)))
    threading.Thread(target=files.serve_forever, daemon=True).start()
    examples = f"http://127.0.0.1:{files.server_address[1]}"
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    _running["ray"] = ray
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = {**APP_ARGS, "auth": {"allowed_origins": [examples]},  # the server's own page needs no entry
            "worlds": {**APP_ARGS["worlds"], "root": _running.setdefault("worlds", tempfile.mkdtemp(prefix="lwf-worlds-"))}}
    serve.run(build_app(AppArgs.model_validate(args)), name="lwf-client-tests", route_prefix="/", blocking=False)
    http = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            if requests.get(f"{http}/healthz", timeout=5).status_code == 200:
                return Served(http=http, ws=f"ws://127.0.0.1:{port}{CAMERA_PATH}", examples=examples)
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the serve app did not become healthy within {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(0.5)


def _stop() -> None:
    ray = _running.pop("ray", None)
    _running.pop("served", None)
    files = _running.pop("files", None)
    if files is not None:
        files.shutdown()
        files.server_close()
    if ray is not None:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    worlds = _running.pop("worlds", None)
    if worlds is not None:  # after the app: its writer is gone
        shutil.rmtree(worlds, ignore_errors=True)


@pytest.fixture(scope="session")
def served() -> Served:
    """The running app (started on first use)."""
    if "served" not in _running:
        try:
            _running["served"] = _start()
        except BaseException:
            _stop()
            raise
    return _running["served"]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """Stop the app after the last test of this folder (a session fixture would outlive it)."""
    if _running and (nextitem is None or HERE not in nextitem.path.parents):
        _stop()
