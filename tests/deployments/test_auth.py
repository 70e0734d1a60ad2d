"""Auth: API keys from the named environment variable, Bearer header or query parameter, origins."""
from __future__ import annotations

import pytest
from starlette.requests import HTTPConnection

from deployments.auth import Auth
from deployments.config import AuthArgs


def conn(headers: dict[str, str] | None = None, query: str = "") -> HTTPConnection:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return HTTPConnection({"type": "websocket", "headers": raw, "query_string": query.encode(), "path": "/"})


def test_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("TEST_LWF_KEYS", " k1 , k2 ")
    auth = Auth(AuthArgs(api_keys_env="TEST_LWF_KEYS"))
    assert auth.key_accepted(conn({"Authorization": "Bearer k2"}))
    assert auth.key_accepted(conn(query="api_key=k1"))
    assert not auth.key_accepted(conn({"Authorization": "Bearer k3"}))
    assert not auth.key_accepted(conn({"Authorization": "k1"}))  # not a bearer token
    assert not auth.key_accepted(conn())


def test_auth_off_and_a_missing_secret(monkeypatch):
    assert Auth(AuthArgs()).key_accepted(conn())
    monkeypatch.delenv("TEST_LWF_KEYS", raising=False)
    with pytest.raises(ValueError, match="TEST_LWF_KEYS"):
        Auth(AuthArgs(api_keys_env="TEST_LWF_KEYS"))


def test_origins():
    auth = Auth(AuthArgs(allowed_origins=["https://app.example"]))
    assert auth.origin_allowed(conn({"Origin": "https://app.example"}))
    assert not auth.origin_allowed(conn({"Origin": "https://evil.example"}))
    assert auth.origin_allowed(conn())  # non-browser clients send no Origin
    assert Auth(AuthArgs()).origin_allowed(conn({"Origin": "https://any.example"}))
