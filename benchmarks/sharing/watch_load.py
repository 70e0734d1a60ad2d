"""One owner driving a shared world while N viewers watch it (issue 56), through a served app.

    python -m benchmarks.sharing.watch_load --url ws://127.0.0.1:8000/v1/realtime/world/camera \\
        --viewers 1 50 200 --chunks 10 --out watch_load.json

Per run (the viewer counts in order, with runs of 0 viewers first and last: the baseline, twice,
as the machine's other load moves): the owner starts a session (`prefix_cache: false`), makes
chunk 0, `share`s it (audience `link`, controls `owner`), N viewers connect to the watch route
(the proxy spreads them over the ingress replicas) and get `watching`; then the owner sends
chunks 1..C, two infers in flight, and records when each frame reply arrives; every viewer
records when each chunk arrives (time taken as the message is received; only msgpack-unpacked, not
validated: in one process, 200 viewers' validation would be part of the lag measured).
Then `unshare`, reset, the viewers' sockets closed.

Reported per run: the owner's chunk interval (median of the gaps between its replies, chunks
2..C) and its ratio to the baseline's (the mean of the two 0-viewer runs); viewer lag (a
viewer's receipt of chunk k minus the owner's receipt of chunk k) p50 / p95 / max over every
(viewer, chunk), and the p50 over chunks of the first viewer's lag (the path's latency: owner's
replica -> hub -> each replica's feed -> proxy; the rest of the lag is the fan-out's queue);
chunks skipped (a chunk after a viewer's first that it never got); viewers per ingress replica
(`watching.debug`, with debug_fields on); and the ingress replicas' memory: RSS
(from /proc of their processes, benchmarks/sharing/ingress_memory.py: run it on the server's
machine, `--server-pid` the process that started its Ray; `--no-rss` skips it) summed
before the viewers join and with them joined, its delta divided by N. Viewers run in this one
process (one event loop): on a loaded machine its own scheduling is part of the lag it sees.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import msgpack
import websockets

from benchmarks.line.seats import run_to_end
from benchmarks.resume_drill import _frame, _reset_and_close, _socket
from benchmarks.sharing.ingress_memory import ingress_rss
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol import decode_reply, encode
from protocol.messages import FrameReply, ShareRequest, UnshareRequest
from protocol.sharing import Shared, WatchRequest, Watching

SEED = 56
WATCH_PATH = "/v1/realtime/world/watch"
CAMERA_PATH = "/v1/realtime/world/camera"


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Viewer:
    """One viewer's socket: `watch`, then each frame's arrival time by chunk id."""

    def __init__(self, ws, watching: Watching) -> None:
        self.ws = ws
        self.watching = watching
        self.at: dict[int, float] = {}
        self.task: Optional[asyncio.Task] = None

    @classmethod
    async def join(cls, url: str, world_id: str, token: str, timeout_s: float) -> Viewer:
        ws = await websockets.connect(url, max_size=None, open_timeout=timeout_s)
        await ws.send(encode(WatchRequest(world_id=world_id, watch_token=token)))
        watching = decode_reply(await asyncio.wait_for(ws.recv(), timeout_s))
        if not isinstance(watching, Watching):
            await ws.close()
            raise RuntimeError(f"the watch was refused: {watching}")
        viewer = cls(ws, watching)
        viewer.task = asyncio.create_task(viewer._read())
        return viewer

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                t = time.perf_counter()
                msg = msgpack.unpackb(data)  # no validation: 200 viewers' pydantic work would be part of the lag
                if msg.get("type") == "frame":
                    self.at.setdefault(msg["chunk_id"], t)
        except websockets.ConnectionClosed:
            pass

    async def close(self) -> None:
        await self.ws.close()
        if self.task is not None:
            await asyncio.wait([self.task], timeout=10)


async def join_all(url: str, world_id: str, token: str, n: int, timeout_s: float, batch: int = 25) -> list[Viewer]:
    viewers: list[Viewer] = []
    for i in range(0, n, batch):  # in batches: the proxy and the hub take them a few at a time
        viewers += await asyncio.gather(*(Viewer.join(url, world_id, token, timeout_s) for _ in range(min(batch, n - i))))
    return viewers


def memory(args: argparse.Namespace) -> Optional[int]:
    """The ingress replicas' summed RSS; None (and a line on stderr) where it cannot be read."""
    if not args.rss:
        return None
    try:
        rss, replicas = ingress_rss(args.app, args.server_pid)
        args.ingress_replicas_measured = replicas
        return rss
    except Exception as e:  # noqa: BLE001 - another machine, another app name: the rest is still measured
        print(f"ingress memory not measured: {e!r}", file=sys.stderr)
        args.rss = False
        return None


async def one_run(args: argparse.Namespace, n: int, label: str) -> dict:
    sid = f"watch-{label}"
    traj = synthetic_trajectory("orbit", 9 + 12 * args.chunks, prompt=f"{DEFAULT_PROMPT} (watch load)")
    messages = traj.messages(plan_session(traj, 9 + 12 * args.chunks), sid, seed=SEED, prefix_cache=False,
                             open_ended=args.open_ended)
    watch_url = args.url.replace(CAMERA_PATH, WATCH_PATH)
    owner_at: dict[int, float] = {}
    viewers: list[Viewer] = []
    rss_before = rss_joined = None
    async with _socket(args.url, sid) as (ws, _):
        await ws.send(messages[0])
        assert isinstance(reply := await _frame(ws, args.timeout_s), FrameReply), reply
        await ws.send(encode(ShareRequest(session_id=sid)))
        assert isinstance(shared := await _frame(ws, args.timeout_s), Shared), shared
        try:
            if n:
                rss_before = memory(args)
                viewers = await join_all(watch_url, shared.world_id, shared.watch_token, n, args.timeout_s)
                await asyncio.sleep(1.0)  # the feeds' polls and the viewers' queues settle
                rss_joined = memory(args) if rss_before is not None else None
            sent, got = 1, 0
            while got < args.chunks:
                while sent <= args.chunks and sent - 1 - got < 2:
                    await ws.send(messages[sent])
                    sent += 1
                reply = await _frame(ws, args.timeout_s)
                assert isinstance(reply, FrameReply), reply
                owner_at[reply.chunk_id] = time.perf_counter()
                got += 1
            deadline = time.perf_counter() + args.drain_s  # the viewers' last chunk, or give up on it
            while time.perf_counter() < deadline and not all(args.chunks in v.at for v in viewers):
                await asyncio.sleep(0.05)
            await ws.send(encode(UnshareRequest(session_id=sid)))
            await _frame(ws, args.timeout_s)
        finally:
            for v in viewers:
                await v.close()
        await _reset_and_close(ws, sid, args.timeout_s)
    gaps = [owner_at[k] - owner_at[k - 1] for k in range(2, args.chunks + 1)]
    lags, skipped, per_replica = [], 0, {}
    first_lags = [min(v.at[k] for v in viewers if k in v.at) - owner_at[k] for k in range(1, args.chunks + 1)
                  if any(k in v.at for v in viewers)]  # the path's latency, without the fan-out's queue
    for v in viewers:
        first = v.watching.next_chunk_id if v.watching.next_chunk_id is not None else 0
        wanted = range(max(first, 1), args.chunks + 1)  # chunk 0 came before the share
        lags += [v.at[k] - owner_at[k] for k in wanted if k in v.at]
        skipped += sum(k not in v.at for k in wanted)
        replica = str((v.watching.debug or {}).get("ingress_replica", "?"))
        per_replica[replica] = per_replica.get(replica, 0) + 1
    run = {"viewers": n, "chunks": args.chunks, "owner_interval_s": round(statistics.median(gaps), 4),
           "owner_intervals_s": [round(g, 4) for g in gaps], "chunks_skipped": skipped,
           "viewers_per_ingress_replica": per_replica}
    if lags:
        run["lag_s"] = {"p50": round(percentile(lags, 0.5), 4), "p95": round(percentile(lags, 0.95), 4),
                        "max": round(max(lags), 4), "samples": len(lags),
                        "first_viewer_p50": round(percentile(first_lags, 0.5), 4)}
    if rss_before is not None and rss_joined is not None:
        run["ingress_rss_mib"] = {"replicas": args.ingress_replicas_measured,
                                  "before": round(rss_before / 2**20, 1), "joined": round(rss_joined / 2**20, 1),
                                  "per_viewer_kib": round((rss_joined - rss_before) / n / 1024, 1)}
    print(json.dumps({k: v for k, v in run.items() if k != "owner_intervals_s"}), flush=True)
    return run


async def bench(args: argparse.Namespace, write) -> dict:
    result: dict = {"url": args.url, "chunks": args.chunks, "runs": []}
    plan = [0, *args.viewers, 0]
    for i, n in enumerate(plan):
        result["runs"].append(await one_run(args, n, f"{i}-{n}"))
        write(result)
    base = [r["owner_interval_s"] for r in result["runs"] if r["viewers"] == 0]
    result["baseline_interval_s"] = round(statistics.mean(base), 4)
    for r in result["runs"]:
        r["interval_ratio"] = round(r["owner_interval_s"] / result["baseline_interval_s"], 3)
    write(result)
    return result


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=f"ws://127.0.0.1:8000{CAMERA_PATH}")
    p.add_argument("--viewers", type=int, nargs="+", default=[1, 50, 200])
    p.add_argument("--chunks", type=int, default=10, help="chunks the owner makes while they watch (after chunk 0)")
    p.add_argument("--open-ended", action="store_true", help="the owner declares no num_frames (a window config)")
    p.add_argument("--drain-s", type=float, default=10.0, help="how long the viewers may take for the last chunk")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--app", default="lingbot-world", help="the Serve application (its ingress replicas' memory)")
    p.add_argument("--server-pid", type=int, help="the process that started the server's Ray (`serve run`'s; "
                                                 "default: this one, a driver that serves the app itself)")
    p.add_argument("--no-rss", dest="rss", action="store_false", help="not on the server's machine: no memory")
    p.add_argument("--out", type=Path, default=Path("watch_load.json"))
    args = p.parse_args(argv)

    def write(result: dict) -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    result = run_to_end(bench(args, write))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return result


if __name__ == "__main__":
    main()
