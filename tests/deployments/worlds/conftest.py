"""The world store's backends for the contract tests: a local folder, and a real S3 server
(SeaweedFS, tests/seaweed.py) started once for this folder's tests and ended after them."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from deployments.worlds.local import LocalStore
from deployments.worlds.store import WorldStore
from seaweed import SeaweedServer, s3_store


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[SeaweedServer]:
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_credentials(monkeypatch):
    monkeypatch.setenv("LWF_TEST_S3_KEY", "any")
    monkeypatch.setenv("LWF_TEST_S3_SECRET", "any")


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> WorldStore:
    """Each contract test runs on both backends."""
    if request.param == "local":
        return LocalStore(tmp_path / "worlds")
    request.getfixturevalue("s3_credentials")
    return s3_store(request.getfixturevalue("s3_server"))
