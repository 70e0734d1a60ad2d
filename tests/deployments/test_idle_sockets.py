"""Idle sockets against the connection caps, through a real app (issue 31): a few addresses
that open many sockets and send nothing cannot keep new clients out. New addresses get the
slots reserved for them (`connection.reserved_for_new_clients`) at once, and every idle socket
is closed at the handshake deadline (`connection.first_message_timeout_s`, 5 s by default),
giving its slot back. Before: the sockets held every slot for 30 s and each new client got
`server_full`."""
from __future__ import annotations

import asyncio
import time

import pytest
import websockets

from protocol import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply

APP = "idlesockets"
TOTAL = 12
RESERVED = 4
DEADLINE_S = 3.0
ADDRESSES = 4


@pytest.fixture(scope="module")
def idle_app(extra_app):
    from ray import serve
    app, _ = extra_app(
        APP, dit={"num_replicas": 1},
        connection={"trust_forwarded_for": True, "max_connections": TOTAL, "max_connections_per_client": TOTAL,
                    "reserved_for_new_clients": RESERVED, "first_message_timeout_s": DEADLINE_S})
    yield app
    serve.delete(APP)


async def _open(url: str, addr: str):
    """A socket from `addr`: (the socket, its first message)."""
    ws = await websockets.connect(url, max_size=None, additional_headers={"X-Forwarded-For": addr})
    return ws, decode_reply(await asyncio.wait_for(ws.recv(), 30))


def test_idle_sockets_of_a_few_addresses_do_not_keep_new_clients_out(idle_app):
    async def go():
        idle, refused = [], []
        for i in range(TOTAL + 4):  # 4 addresses try 16 sockets and never send a frame
            ws, first = await _open(idle_app.ws, f"10.1.0.{i % ADDRESSES}")
            (idle if isinstance(first, CameraServerConfig) else refused).append((ws, first))
        assert len(idle) == TOTAL - RESERVED  # the reserve stays for addresses that hold no socket
        assert all(isinstance(f, ErrorReply) and f.code is ErrorCode.BUSY for _, f in refused)
        t0 = time.monotonic()
        newcomer, first = await _open(idle_app.ws, "10.2.0.1")  # a new address: a reserved slot, at once
        assert isinstance(first, CameraServerConfig)
        handshake_s = time.monotonic() - t0
        closes = []
        for ws, _ in idle:  # each idle socket is closed at the deadline, with a reason
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), DEADLINE_S + 30)
            closes.append((ws.close_code, time.monotonic() - t0))
        assert all(code == 1008 for code, _ in closes), closes
        # Their slots are back: one of the idle addresses connects again.
        again, first = await _open(idle_app.ws, "10.1.0.0")
        assert isinstance(first, CameraServerConfig)
        print(f"RELIABILITY idle sockets: {len(idle)} idle admitted, {len(refused)} refused, newcomer's handshake "
              f"{handshake_s:.2f} s, idle closed by {max(t for _, t in closes):.1f} s (deadline {DEADLINE_S:g} s)")
        for ws in (newcomer, again, *(w for w, _ in refused)):
            await ws.close()
    asyncio.run(go())
