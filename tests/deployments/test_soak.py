"""Soak: ~200 chunks over many sessions with resets, prompt changes and dropped sockets; no
error for valid traffic, and the replicas end where they started: no session, no cache bytes,
and resident memory within a tolerance of what it was after the first cycles (the allocators
and the H.264 encoders' buffers grow over the first ~25 sessions of a process, then stay flat:
a leak would grow with every later cycle)."""
from __future__ import annotations

import asyncio
import time

import httpx

from protocol.messages import FrameReply, ResetOk

WORKERS = 4  # = the app's session capacity (2 DiT replicas x 2)
WARM_CYCLES, MEASURED_CYCLES = 2, 3  # per worker; a cycle sends 11 chunks (see `cycle`)
RSS_TOLERANCE = 64 * 1024 * 1024


def _stats(stats_of) -> dict[str, list[dict]]:
    return {name: stats_of("lwf", name) for name in ("DiTDeployment", "VaeDeployment")}


def _settled(stats_of, timeout: float = 30.0) -> dict[str, list[dict]]:
    """Stats once no replica holds a session or cache bytes (a closed session's memory is freed
    after the call that was running for it)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(stats_of)
        if all(r["sessions"] == 0 and r["cache_bytes"] == 0 for rs in stats.values() for r in rs):
            return stats
        assert time.monotonic() < deadline, f"replicas still hold sessions or cache bytes: {stats}"
        time.sleep(0.2)


def test_soak_returns_every_replica_to_its_baseline(server, connect, example, stats_of):
    async def frames(c, n: int) -> list[FrameReply]:
        replies = [await c.recv() for _ in range(n)]
        assert all(isinstance(r, FrameReply) for r in replies), replies
        return replies

    async def cycle(w: int, i: int, counts: dict[str, int]) -> None:
        sid = f"soak-{w}-{i}"
        async with connect() as c:
            await c.run_session(sid, example, seed=w)  # a whole session, pipelined
            assert isinstance(await c.reset(sid), ResetOk)
            for k in range(2):  # reset in the middle of a session
                await c.infer(sid, example, k, first=k == 0, seed=w)
            await frames(c, 2)
            await c.reset(sid)
            await c.infer(sid, example, 0, first=True, seed=w)  # then a prompt change: implicit reset
            await frames(c, 1)
            for k in range(3):
                await c.infer(sid, example, k, first=k == 0, seed=w, prompt=f"{example.prompt} ({i})")
            changed = await frames(c, 3)
            assert changed[0].reset and changed[0].chunk_id == 0
            await c.reset(sid)
            for k in range(2):  # leave with a chunk in flight: the connection frees the session
                await c.infer(sid + "-gone", example, k, first=k == 0, seed=w)
            await frames(c, 1)
        counts["sent"] += 11
        counts["received"] += 10
        counts["sessions"] += 4
        counts["resets"] += 3
        counts["reconnects"] += 1

    async def soak(cycles: range, counts: dict[str, int]) -> None:
        async def worker(w: int) -> None:
            for i in cycles:
                await cycle(w, i, counts)

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))

    server.wait_held(0)
    counts = dict.fromkeys(("sent", "received", "sessions", "resets", "reconnects"), 0)
    t0 = time.monotonic()
    asyncio.run(soak(range(WARM_CYCLES), counts))
    before = _settled(stats_of)
    asyncio.run(soak(range(WARM_CYCLES, WARM_CYCLES + MEASURED_CYCLES), counts))
    seconds = time.monotonic() - t0
    after = _settled(stats_of)
    assert httpx.get(f"{server.http}/healthz", timeout=10).status_code == 200
    growth = {}
    for name in after:
        for b, a in zip(sorted(before[name], key=lambda s: s["replica"]), sorted(after[name], key=lambda s: s["replica"])):
            assert a["replica"] == b["replica"], "a replica was replaced during the soak"
            assert a["sessions"] == 0 and a["cache_bytes"] == 0, a
            growth[f"{name}/{a['replica']}"] = a["rss_bytes"] - b["rss_bytes"]
    print(f"RELIABILITY soak: chunks_sent={counts['sent']} chunks_received={counts['received']} "
          f"sessions={counts['sessions']} resets={counts['resets']} reconnects={counts['reconnects']} "
          f"seconds={seconds:.0f} errors=0 rss_growth_mib={ {k: round(v / 2**20, 1) for k, v in growth.items()} }")
    assert counts["sent"] >= 200
    assert all(g <= RSS_TOLERANCE for g in growth.values()), growth
