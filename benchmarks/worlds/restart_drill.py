"""The restart drill (issue 55): live sessions survive `serve shutdown` + `serve run`.

    python -m benchmarks.worlds.restart_drill --phase start --state drill.json   # then stop Serve, run it again
    python -m benchmarks.worlds.restart_drill --phase resume --state drill.json --out restart_drill.json

`start` (against the app with its world store on): each of `--sessions` sessions (seeds SEED + i,
`prefix_cache: false`) is first played uninterrupted for `--chunks` chunks and reset (the
reference); then all of them at once, each on its own socket, play `--before` chunks; the
drill waits until the ingress's writer has nothing queued (/healthz `worlds.queued` 0, then
`--settle-s` more: a chunk the client received is in the store within 2 s) and closes the
sockets without a reset. The state file keeps each session's resume token and the SHA-256 of
its chunks and of the reference's. Serve is then stopped and started again (gpu_serve.sh
RESTART_DRILL=1; the test stands in with `serve.delete` + `serve.run`).

`resume` (against the new app): each session on a new socket sends its next infer with its
resume token and `resume_from` (the new app's parking knows none: the ingress finds the session
in the world store and rebuilds it), then plays to `--chunks`. Per session: the chunks
identical to the reference's, the seconds from its connect to its first frame; in all:
`identical_chunks`, `all_identical`, and with `--stopped-at` (epoch seconds when the stop
began) the seconds from the stop to the last session's first frame after it.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Optional

from benchmarks.line.seats import run_to_end
from benchmarks.resume_drill import _play, _reset_and_close, _socket
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol import encode
from protocol.requests import SessionStart, plan_requests

SEED = 550
FIRST_CHUNK_FRAMES, CHUNK_FRAMES = 9, 12


def digest(video: bytes) -> str:
    return hashlib.sha256(video).hexdigest()


def requests(chunks: int, sid: str, i: int, open_ended: bool) -> list:
    frames = FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (chunks - 1)
    traj = synthetic_trajectory(("dolly", "orbit", "pan")[i % 3], frames, prompt=f"{DEFAULT_PROMPT} (restart {i})")
    start = SessionStart(traj.image, traj.prompt, seed=SEED + i, intrinsics_resolution=traj.intrinsics_resolution,
                         prefix_cache=False)
    return plan_requests(plan_session(traj, frames), sid, start, open_ended=open_ended)


def http_of(url: str) -> str:
    base = url.replace("ws://", "http://").replace("wss://", "https://")
    return base.split("/v1/realtime/")[0]


def store_queued(url: str) -> int:
    with urllib.request.urlopen(f"{http_of(url)}/healthz", timeout=10) as r:
        return int(json.loads(r.read())["worlds"]["queued"])


async def wait_written(url: str, settle_s: float, timeout_s: float = 60.0) -> float:
    """Until /healthz says nothing waits for the store three times in a row, then `settle_s`."""
    t0, quiet = time.perf_counter(), 0
    while quiet < 3:
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit("the world store's writer still had chunks queued")
        quiet = quiet + 1 if await asyncio.to_thread(store_queued, url) == 0 else 0
        await asyncio.sleep(0.2)
    await asyncio.sleep(settle_s)
    return time.perf_counter() - t0


async def reference(url: str, sid: str, i: int, chunks: int, open_ended: bool, timeout_s: float) -> list[str]:
    messages = [encode(r) for r in requests(chunks, sid, i, open_ended)]
    videos: dict[int, bytes] = {}
    async with _socket(url, sid) as (ws, _):
        await _play(ws, messages, videos, 0, chunks, timeout_s)
        await _reset_and_close(ws, sid, timeout_s)
    return [digest(videos[k]) for k in range(chunks)]


async def live(url: str, sid: str, i: int, chunks: int, before: int, open_ended: bool, timeout_s: float,
               played: asyncio.Event, parked: asyncio.Event) -> dict:
    """`before` chunks (then `played` is set), the socket open until `parked` is set; closed without a reset."""
    messages = [encode(r) for r in requests(chunks, sid, i, open_ended)]
    videos: dict[int, bytes] = {}
    async with _socket(url, sid) as (ws, _):
        _, _, token = await _play(ws, messages[:before], videos, 0, before, timeout_s)  # none in flight after
        played.set()
        await parked.wait()
    assert token, "the server issued no resume_token (sessions.resume.grace_s 0?)"
    return {"token": token, "chunks": [digest(videos[k]) for k in range(before)]}


async def start(args: argparse.Namespace) -> dict:
    sids = [f"restart-{i}" for i in range(args.sessions)]
    refs = {sid: await reference(args.url, f"ref-{sid}", i, args.chunks, args.open_ended, args.timeout_s)
            for i, sid in enumerate(sids)}
    played, parked = [asyncio.Event() for _ in sids], asyncio.Event()
    tasks = [asyncio.create_task(live(args.url, sid, i, args.chunks, args.before, args.open_ended, args.timeout_s,
                                      played[i], parked)) for i, sid in enumerate(sids)]
    try:
        while not all(e.is_set() for e in played):  # all of them live at once
            for t in tasks:
                if t.done():
                    t.result()  # a session that failed ends the drill
            await asyncio.sleep(0.1)
        written_s = await wait_written(args.url, args.settle_s)
    finally:
        parked.set()
    runs = [await t for t in tasks]
    return {"chunks": args.chunks, "before": args.before, "open_ended": args.open_ended, "written_s": round(written_s, 3),
            "sessions": {sid: {"index": i, "reference": refs[sid], **run} for i, (sid, run) in
                         enumerate(zip(sids, runs))}}


async def resumed(url: str, sid: str, s: dict, chunks: int, before: int, open_ended: bool, timeout_s: float) -> dict:
    reqs = requests(chunks, sid, s["index"], open_ended)
    reqs[before] = reqs[before].model_copy(update={"resume_token": s["token"], "resume_from": before})
    messages = [encode(r) for r in reqs]
    videos: dict[int, bytes] = dict.fromkeys(range(before), b"")  # the chunks it has (their digests in `s`)
    async with _socket(url, sid) as (ws, _):
        t_connect = time.perf_counter()
        _, first_s, _ = await _play(ws, messages, videos, before, chunks, timeout_s, t_connect)
        first_at = time.time()
        await _reset_and_close(ws, sid, timeout_s)
    got = s["chunks"] + [digest(videos[k]) for k in range(before, chunks)]
    return {"identical_chunks": sum(a == b for a, b in zip(got, s["reference"])), "chunks": chunks,
            "first_frame_after_connect_s": round(first_s, 3), "first_frame_at": first_at}


async def resume(args: argparse.Namespace, state: dict) -> dict:
    runs = {}
    for sid, s in state["sessions"].items():  # one after the other: each one's first frame is its own rebuild
        runs[sid] = await resumed(args.url, sid, s, state["chunks"], state["before"], state["open_ended"],
                                  args.timeout_s)
    last = max(r.pop("first_frame_at") for r in runs.values())
    identical = sum(r["identical_chunks"] for r in runs.values())
    out = {"sessions": runs, "chunks": state["chunks"], "resumed_at_chunk": state["before"],
           "identical_chunks": identical, "of_chunks": state["chunks"] * len(runs),
           "all_identical": identical == state["chunks"] * len(runs), "written_before_stop_s": state["written_s"]}
    if args.healthy_s is not None:
        out["time_to_healthy_s"] = args.healthy_s
    if args.stopped_at is not None:
        out["stop_to_all_resumed_s"] = round(last - args.stopped_at, 3)
    return out


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("start", "resume"), required=True)
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--state", type=Path, required=True, help="written by `start`, read by `resume`")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--chunks", type=int, default=5, help="each session's chunks in all")
    p.add_argument("--before", type=int, default=2, help="chunks played before the restart")
    p.add_argument("--open-ended", action="store_true", help="declare no num_frames (a window config)")
    p.add_argument("--settle-s", type=float, default=2.0)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--healthy-s", type=float, help="resume: the new app's time to healthy (recorded)")
    p.add_argument("--stopped-at", type=float, help="resume: epoch seconds when Serve's stop began")
    p.add_argument("--out", type=Path, default=Path("restart_drill.json"))
    args = p.parse_args(argv)
    if not 0 < args.before < args.chunks:
        p.error("--before must be in 1..chunks-1")
    if args.phase == "start":
        result = run_to_end(start(args))
        args.state.write_text(json.dumps(result, indent=2) + "\n")
    else:
        result = run_to_end(resume(args, json.loads(args.state.read_text())))
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
