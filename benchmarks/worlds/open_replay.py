"""Opening a saved world against replaying it from its inputs (issue 55), through a served app.

    python -m benchmarks.worlds.open_replay --url ws://127.0.0.1:8000/v1/realtime/world/camera \\
        --open 10,50,100 --out open_replay.json        # the app's world store on (`worlds.enabled`)

1. build: one session (`prefix_cache: false`, seed SEED) of max(--open) + 1 chunks, one chunk
   at a time; after chunk n - 1 for each n of --open, `save` makes a world of n chunks (the
   session goes on);
2. open: for each n, a new socket sends `open {world_id}` and then the infer of chunk n (the
   first new chunk): the seconds to `opened` and to that chunk's frame reply (what a person
   coming back to a world waits: the ingress loads it from the store and the DiT / VAE replicas
   rebuild their caches from its journal), and whether the chunk's fMP4 bytes are the build
   session's chunk n;
3. replay: a new session with the same inputs (image, prompt, seed, cameras; `prefix_cache:
   false`: computed again, not served from the prefix store), two infers in flight, from its
   connect: the seconds to chunk n's frame for each n (what a server without the world store
   offers: the same chunks computed again through the model, every one decoded and encoded),
   and whether its bytes are the build's.

The result is written after the open (a run cut by its timeout keeps it) and again after the
replay. `--open-ended`: the sessions declare no `num_frames` (a window config's long sessions).
A session that finds every seat taken waits in the server's line (benchmarks/line/wait.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Optional

from benchmarks.line.seats import run_to_end
from benchmarks.line.wait import LineWait
from benchmarks.resume_drill import _frame, _play, _reset_and_close, _socket
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol import encode
from protocol.messages import FrameReply, Opened, OpenRequest, Saved, SaveRequest

SEED = 55
FIRST_CHUNK_FRAMES, CHUNK_FRAMES = 9, 12


def frames_for(chunks: int) -> int:
    return FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (chunks - 1)


def session_messages(chunks: int, sid: str, open_ended: bool, trajectory: str = "dolly") -> list[bytes]:
    frames = frames_for(chunks)
    traj = synthetic_trajectory(trajectory, frames, prompt=f"{DEFAULT_PROMPT} (world open)")
    return traj.messages(plan_session(traj, frames), sid, seed=SEED, prefix_cache=False, open_ended=open_ended)


async def build(url: str, opens: list[int], open_ended: bool, timeout_s: float) -> dict:
    """The session that makes the worlds: its videos, the world id of each n, its chunk times."""
    sid, total = "open-build", max(opens) + 1
    messages = session_messages(total, sid, open_ended)
    wait, videos, worlds, at = LineWait(), [], {}, []
    async with _socket(url, sid) as (ws, _):
        t0 = time.perf_counter()
        for k in range(total):
            await ws.send(messages[k])
            reply = await _frame(ws, timeout_s, wait)
            assert isinstance(reply, FrameReply) and reply.chunk_id == k, reply
            wait.served()
            videos.append(reply.video)
            at.append(time.perf_counter() - t0)
            if k + 1 in opens:
                await ws.send(encode(SaveRequest(session_id=sid, title=f"{k + 1} chunks")))
                saved = await _frame(ws, timeout_s)
                assert isinstance(saved, Saved) and saved.chunks == k + 1, saved
                worlds[k + 1] = saved.world_id
        await _reset_and_close(ws, sid, timeout_s)
    steps = [b - a for a, b in zip(at, at[1:])]
    return {"videos": videos, "worlds": worlds, "chunk_s_p50": statistics.median(steps) if steps else None,
            "line": wait.report()}


async def open_world(url: str, world_id: str, n: int, total: int, open_ended: bool, reference: bytes,
                     timeout_s: float) -> dict:
    """`total`: the build session's chunks (its trajectory: chunk n's camera is the build's)."""
    sid = f"open-{n}"
    infer = session_messages(total, sid, open_ended)[n]
    async with _socket(url, sid) as (ws, _):
        t0 = time.perf_counter()
        await ws.send(encode(OpenRequest(session_id=sid, world_id=world_id)))
        opened = await _frame(ws, timeout_s)
        assert isinstance(opened, Opened) and opened.next_chunk_id == n, opened
        t_opened = time.perf_counter()
        await ws.send(infer)
        reply = await _frame(ws, timeout_s)
        assert isinstance(reply, FrameReply) and reply.chunk_id == n, reply
        t_chunk = time.perf_counter()
        await _reset_and_close(ws, sid, timeout_s)
    return {"world_id": world_id, "opened_s": round(t_opened - t0, 3),
            "open_to_first_new_chunk_s": round(t_chunk - t0, 3), "identical": reply.video == reference}


async def replay(url: str, opens: list[int], open_ended: bool, videos: list[bytes], timeout_s: float) -> dict:
    sid, total = "open-replay", max(opens) + 1
    messages = session_messages(total, sid, open_ended)
    wait, got, debug = LineWait(), {}, []
    async with _socket(url, sid) as (ws, _):
        t0 = time.perf_counter()
        await _play(ws, messages, got, 0, total, timeout_s, t0, debug=debug, wait=wait)
        await _reset_and_close(ws, sid, timeout_s)
    return {"to_chunk_s": {str(n): round(debug[n]["at"] - t0, 3) for n in opens},
            "identical_chunks": sum(got[k] == v for k, v in enumerate(videos)), "line": wait.report()}


async def bench(args: argparse.Namespace, write) -> dict:
    opens = sorted({int(n) for n in args.open.split(",")})
    built = await build(args.url, opens, args.open_ended, args.timeout_s)
    videos = built.pop("videos")
    result = {"open": opens, "open_ended": args.open_ended, "chunks_built": len(videos),
              "build_chunk_s_p50": built["chunk_s_p50"], "line": {"build": built["line"]}, "opened": {}}
    for n in opens:
        result["opened"][str(n)] = await open_world(args.url, built["worlds"][n], n, len(videos), args.open_ended, videos[n],
                                                    args.timeout_s)
    result["all_identical"] = all(o["identical"] for o in result["opened"].values())
    write(result)
    if args.replay:
        r = await replay(args.url, opens, args.open_ended, videos, args.timeout_s)
        result["line"]["replay"] = r.pop("line")
        result["replay"] = r
        result["all_identical"] = result["all_identical"] and r["identical_chunks"] == len(videos)
        result["open_vs_replay"] = {
            str(n): {"open_s": result["opened"][str(n)]["open_to_first_new_chunk_s"], "replay_s": r["to_chunk_s"][str(n)],
                     "replay_over_open": round(r["to_chunk_s"][str(n)] / result["opened"][str(n)]
                                               ["open_to_first_new_chunk_s"], 2)} for n in opens}
        write(result)
    return result


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--open", default="10,50,100", help="the chunk counts of the worlds saved and opened")
    p.add_argument("--open-ended", action="store_true", help="declare no num_frames (a window config)")
    p.add_argument("--no-replay", dest="replay", action="store_false", help="only build, save and open")
    p.add_argument("--timeout-s", type=float, default=300.0, help="the longest wait for one reply")
    p.add_argument("--out", type=Path, default=Path("open_replay.json"))
    args = p.parse_args(argv)

    def write(result: dict) -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    result = run_to_end(bench(args, write))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
