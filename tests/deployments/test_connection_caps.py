"""ConnectionCaps: total, per client address and per API key; refusals count nothing."""
from __future__ import annotations

from types import SimpleNamespace

from starlette.datastructures import Headers

from deployments.connection_caps import ConnectionCaps, client_address


def test_caps_refuse_beyond_each_limit_and_releases_give_room_back():
    caps = ConnectionCaps(total=4, per_client=2, per_key=3)
    assert caps.admit("1.1.1.1", "k1") is None and caps.admit("1.1.1.1", "k1") is None
    assert caps.admit("1.1.1.1", "k2")[0] == "client_cap"
    assert caps.admit("2.2.2.2", "k1") is None
    assert caps.admit("3.3.3.3", "k1")[0] == "key_cap"
    assert caps.admit("3.3.3.3", None) is None  # auth off: no key to count
    assert caps.open == 4
    reason, message = caps.admit("4.4.4.4", "k2")
    assert reason == "server_full" and "4 connections" in message
    caps.release("1.1.1.1", "k1")
    assert caps.open == 3 and caps.admit("1.1.1.1", "k2") is None


def test_client_address_uses_x_forwarded_for_only_when_trusted():
    # the client forged "1.2.3.4"; the trusted proxy (10.0.0.1) appended the real address
    conn = SimpleNamespace(headers=Headers({"x-forwarded-for": "1.2.3.4, 9.9.9.9"}),
                           client=SimpleNamespace(host="10.0.0.1"))
    assert client_address(conn, trust_forwarded_for=False) == "10.0.0.1"
    assert client_address(conn, trust_forwarded_for=True) == "9.9.9.9"
    bare = SimpleNamespace(headers=Headers({}), client=None)
    assert client_address(bare, trust_forwarded_for=True) == "unknown"
