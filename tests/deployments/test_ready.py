"""The ingress's `ready` line (deployments/ingress/ready.py): the URL to open, logged once the probe passes."""
from __future__ import annotations

import asyncio
import logging

import pytest

from deployments.ingress import ready
from deployments.log import get_log


@pytest.mark.parametrize("root, prefix, url", [
    ("http://127.0.0.1:8000", "/", "http://127.0.0.1:8000/"),
    ("http://0.0.0.0:8000", "/", "http://127.0.0.1:8000/"),  # a wildcard host: open it here
    ("http://[::]:8000", "/lwf", "http://127.0.0.1:8000/lwf/"),
    ("http://10.0.0.5:9000/root", "/lwf/", "http://10.0.0.5:9000/root/lwf/"),
    ("http://host:80", None, "http://host:80/"),
])
def test_page_url(root, prefix, url):
    assert ready.page_url(root, prefix) == url


def test_ready_line_names_the_page_and_the_camera_socket():
    assert ready.ready_line("http://127.0.0.1:8000/", "/v1/realtime/world/camera") == (
        "ready: open http://127.0.0.1:8000/ (camera WebSocket ws://127.0.0.1:8000/v1/realtime/world/camera)")


class FlakyProbe:
    """Fails `failures` times (a replica still loading), then passes."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def run(self) -> dict:
        self.calls += 1
        if self.calls <= self.failures:
            raise TimeoutError("dit did not answer a routed probe")
        return {"dit": 0.01}


def test_the_line_comes_once_after_the_probe_passes(monkeypatch, caplog):
    monkeypatch.setattr(ready, "RETRY_S", 0.0)
    monkeypatch.setattr(ready, "_serve_address", lambda: ("http://0.0.0.0:8000", "/"))
    probe = FlakyProbe(2)
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.ingress"):
        asyncio.run(ready.announce_when_ready(probe, "/v1/realtime/world/camera", get_log("ingress")))
    assert probe.calls == 3
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready")]
    assert lines == ["ready: open http://127.0.0.1:8000/ (camera WebSocket ws://127.0.0.1:8000/v1/realtime/world/camera)"]
