"""Hostile and careless clients against the live apps: floods of large frames, connection
exhaustion, refused frames, unauthenticated HTTP, and the small defects of issue 12."""
from __future__ import annotations

import asyncio
import os
from collections import Counter
import struct
import time

import httpx
import msgpack
import pytest
import websockets

from protocol import decode_reply, encode_infer
from protocol.errors import ErrorCode
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply

MIB = 1024 * 1024
FLOOD_SECONDS = 10.0
FLOOD_SOCKETS = 4
RSS_MARGIN = 256 * MIB  # what a flood may leave behind in any process (before the fix: 4-10 GB)


# ---- resident memory of this test run's Ray processes (by process title, under our raylet) ----

def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _rss_by_pid(prefixes: tuple[str, ...]) -> dict[int, tuple[str, int]]:
    """pid -> (name, resident bytes) of this run's Ray processes whose title starts with a prefix
    (the name is the title up to the method Ray appends while a task runs)."""
    import ray

    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    found: dict[int, tuple[str, int]] = {}
    for pid in _children(raylet):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{pid}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
        if title.startswith(prefixes):
            found[pid] = (title.split(".")[0].removeprefix("ray::"), rss)
    return found


TITLES = ("ray::ProxyActor", "ray::ServeReplica:lwf:")


def test_a_flood_of_large_frames_leaves_every_process_near_its_baseline(server):
    """Large frames, as fast as four sockets can send them, reconnecting when closed, for 10 s:
    in turn one just under the server's 12 MiB limit holding a msgpack array of 11 M zeros (an
    array bomb) and one of 15 MiB, over the limit but under the proxy's 16 MiB (so it reaches
    the server). Each is refused with the typed too_large (or the socket is closed for its byte
    rate) and no process keeps the memory."""
    def bomb(n: int) -> bytes:  # poses: array32 of n zeros
        return msgpack.packb({"endpoint": "infer", "session_id": "flood",
                              "cameras": {"intrinsics": [[1, 1, 1, 1]], "poses": None}})[:-1] + \
            b"\xdd" + struct.pack(">I", n) + b"\x00" * n
    frames = (bomb(11 * MIB), bomb(15 * MIB))
    assert len(frames[0]) < DEFAULT_LIMITS.max_message_bytes < len(frames[1]) < 16 * MIB
    baseline = _rss_by_pid(TITLES)
    names = sorted(name for name, _ in baseline.values())
    assert "ProxyActor" in names and any(n.endswith("WorldIngress") for n in names), names

    async def flood(counts: Counter) -> None:
        deadline = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < deadline:
            try:
                async with websockets.connect(server.ws, max_size=None, open_timeout=30) as ws:
                    await ws.recv()
                    while time.monotonic() < deadline:
                        await ws.send(frames[counts["sent"] % 2])
                        counts["sent"] += 1
                        reply = decode_reply(await asyncio.wait_for(ws.recv(), 30))
                        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TOO_LARGE, reply
                        counts["too_large"] += 1
            except websockets.ConnectionClosed as e:
                counts[f"closed {e.rcvd.code if e.rcvd else 1006}"] += 1

    async def go() -> tuple[Counter, dict[str, int]]:
        counts: Counter = Counter()
        peak: dict[str, int] = {}

        async def sample() -> None:
            while True:
                for pid, (_, rss) in (await asyncio.to_thread(_rss_by_pid, TITLES)).items():
                    peak[pid] = max(peak.get(pid, 0), rss)
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(flood(counts) for _ in range(FLOOD_SOCKETS)))
        sampler.cancel()
        return counts, peak

    counts, peak = asyncio.run(go())
    assert counts["sent"] >= FLOOD_SOCKETS and counts.get("closed 1008", 0) >= 1, counts
    time.sleep(2.0)  # closes and frees settle
    after = _rss_by_pid(TITLES)
    grown = {f"{name}/{pid}": (after[pid][1] - rss) // MIB for pid, (name, rss) in baseline.items() if pid in after}
    peaks = {f"{name}/{pid}": (peak.get(pid, rss) - rss) // MIB for pid, (name, rss) in baseline.items()}
    assert len(grown) == len(baseline), "a process died during the flood"
    assert all(g < RSS_MARGIN // MIB for g in grown.values()), grown
    assert httpx.get(f"{server.http}/healthz", timeout=15).status_code == 200
    print("RELIABILITY large-frame flood: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())) +
          f" | MiB after vs before {grown} | peak {peaks}")


def test_refused_frames_in_a_row_close_the_socket(strict_connect, api_keys):
    async def go():
        async with strict_connect(api_keys[5]) as c:
            for _ in range(8):
                await c.send(b"\x90")  # an empty msgpack array: bad_message, 8 times
            replies = []
            try:
                while True:
                    replies.append(decode_reply(await asyncio.wait_for(c.ws.recv(), 30)))
            except websockets.ConnectionClosed as e:
                return replies, e.rcvd

    replies, close = asyncio.run(go())
    assert len(replies) == 8 and all(r.code is ErrorCode.BAD_MESSAGE for r in replies)
    assert close.code == 1008 and "8 frames in a row were refused" in close.reason


def _refused_handshake(url: str, key: str) -> tuple[object, object]:
    async def go():
        ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"})
        reply = decode_reply(await asyncio.wait_for(ws.recv(), 30))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 30)
        return reply, closed.value.rcvd

    return asyncio.run(go())


def test_connection_caps_per_key_and_per_client_answer_busy_and_health_still_answers(strict_server, strict_connect,
                                                                                      api_keys, strict_caps):
    per_client, per_key = strict_caps
    key_a, key_b, key_c = api_keys[5], api_keys[6], api_keys[4]

    async def go():
        held = []
        for _ in range(per_key):
            held.append(await strict_connect(key_a).__aenter__())
        over_key = await asyncio.to_thread(_refused_handshake, strict_server.ws, key_a)
        for _ in range(per_client - per_key):
            held.append(await strict_connect(key_b).__aenter__())
        over_client = await asyncio.to_thread(_refused_handshake, strict_server.ws, key_c)
        health = await asyncio.to_thread(httpx.get, f"{strict_server.http}/healthz", timeout=15)
        await held.pop(0).ws.close()
        await asyncio.sleep(0.5)
        async with strict_connect(key_a) as again:
            ok = again.config
        for c in held:
            await c.ws.close()
        return over_key, over_client, health, ok

    (key_reply, key_close), (client_reply, client_close), health, ok = asyncio.run(go())
    assert isinstance(key_reply, ErrorReply) and key_reply.code is ErrorCode.BUSY and key_reply.retry_after_s
    assert key_close.code == 1013 and key_close.reason == "key_cap"
    assert isinstance(client_reply, ErrorReply) and client_reply.code is ErrorCode.BUSY
    assert client_close.code == 1013 and client_close.reason == "client_cap"
    assert health.status_code == 200  # the caps keep room for health checks
    assert isinstance(ok, CameraServerConfig)  # a closed socket gives its place back


def test_with_auth_on_http_endpoints_need_the_key_and_healthz_shows_only_status(strict_server, api_keys):
    auth = {"Authorization": f"Bearer {api_keys[0]}"}
    for path in ("/v1/models", "/openapi.json", "/docs"):
        assert httpx.get(f"{strict_server.http}{path}", timeout=15).status_code == 401, path
        assert httpx.get(f"{strict_server.http}{path}", headers=auth, timeout=15).status_code == 200, path
    anonymous = httpx.get(f"{strict_server.http}/healthz", timeout=15)
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    full = httpx.get(f"{strict_server.http}/healthz", headers=auth, timeout=15).json()
    assert {"sessions", "connections", "replicas", "probe_s"} <= set(full)
    assert set(full["probe_s"]) == {"text_encoder", "vae", "dit"}


def test_a_refused_infer_names_its_session_and_a_prompt_change_alone_resets(server, connect, example):
    async def go():
        async with connect() as c:
            await c.send(msgpack.packb({"session_id": "named", "seed": "x",
                                        "cameras": {"poses": example.chunk(0)[0].tolist(),
                                                    "intrinsics": example.chunk(0)[1].tolist()}}))
            refused = await c.recv()
            await c.infer("p", example, 0, first=True)
            first = await c.recv()
            await c.send(encode_infer("p", *example.chunk(0), prompt="a different prompt",  # no image
                                      num_frames=example.num_frames, translation_scale=example.scale))
            changed = await c.recv()
            await c.reset("p")
        async with connect() as c:
            await c.infer("fresh", example, 0, first=True, prompt="a different prompt")
            fresh = await c.recv()
            await c.reset("fresh")
        return refused, first, changed, fresh

    refused, first, changed, fresh = asyncio.run(go())
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BAD_MESSAGE
    assert refused.session_id == "named"
    assert isinstance(changed, FrameReply) and changed.reset and changed.chunk_id == 0, changed
    assert changed.video == fresh.video != first.video  # the same image, the new prompt
