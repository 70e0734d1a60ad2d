"""ConnectionCaps: total, per client address and per API key; refusals count nothing."""
from __future__ import annotations

from types import SimpleNamespace

from starlette.datastructures import Headers

from deployments.ingress.guards.connection_caps import ConnectionCaps, client_address


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


def test_addresses_holding_sockets_leave_the_reserved_slots_to_new_addresses():
    caps = ConnectionCaps(total=8, per_client=16, per_key=None, reserved_for_new=2)
    for i in range(6):  # issue 31: a few addresses with many idle sockets
        assert caps.admit(f"10.0.0.{i % 2}", None) is None
    assert caps.admit("10.0.0.0", None)[0] == "server_full"  # an address that holds sockets: not the reserve
    assert caps.admit("10.0.0.7", None) is None and caps.admit("10.0.0.8", None) is None  # new addresses
    assert caps.admit("10.0.0.9", None)[0] == "server_full" and caps.open == 8


def test_a_socket_that_sends_nothing_holds_its_slot_at_most_5_s_by_default():
    from deployments.config import AppArgs
    assert AppArgs().connection.first_message_timeout_s <= 5.0  # was 30: idle sockets held every slot
