"""Resume drill against a running server (issue 15.3): drop a socket mid-session, resume it.

    python -m benchmarks.resume_drill --url ws://127.0.0.1:8000/v1/realtime/world/camera --out resume.json

1. One uninterrupted session of `--frames` frames (the reference), pipeline 2.
2. The same session (same trajectory and seed) again: after chunk `--drop-after` was received,
   with the next chunk in flight, the socket is closed; a new socket sends `resume` with the
   count of replies it has, receives the replies it missed (the chunks in flight at the
   drop), then `resumed`, and plays the rest.
Reports the time from the new socket's connect to its first frame, the chunks replayed, and
whether every chunk's fMP4 bytes equal the reference's (a session continues on its replica's
state, so on one GPU they should: same kernels, same inputs).

Both ways a session can be served (issue 44, item 3), one after the other (`--stores`):
`off`: both sessions send `prefix_cache: false`: the dropped one is computed as the reference was;
`on`: the server's prefix store as configured: the dropped session's chunks are the reference's
(same image, prompt, seed and cameras), so it is served from the store, then materialised by
journal replay when it goes past the stored prefix or resumes: the rebuilt state must continue
with the reference's bytes. With the store off in the config, `on` is the same as `off`.

`--kill-app APP`: a recovery drill after them: the same session once more (store off), and after
chunk `--drop-after` arrived, with the next chunk in flight, the DiT replica holding it is killed
(`ray.kill` of the Serve replica actor of APP, through the local Ray: run it on the server's
machine; the replica the replies' `debug` names, else the application's only DiT replica). The
ingress rebuilds the session from its journal on a replica with room (the controller's
replacement, on one GPU) and the session plays on: each chunk's bytes against the reference's.

A session that finds every seat taken waits in the server's line (`queued` notices, skipped
while they come) and records the wait: per run `line` (`reference`, `session`: `queued_s`, the
notices, benchmarks/line/wait.py) and `queued_s` (their sum; the result's: all runs'). A
session whose run fails, or is ended by SIGTERM (gpu_serve.sh's `timeout`), is reset before its
socket closes: it is not left parked, holding a one-seat server's seat from the next run.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

import websockets

from benchmarks.line.wait import LineWait
from benchmarks.line.seats import run_to_end
from client.trajectory import plan_session
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from protocol import decode_reply, encode
from protocol.messages import CameraServerConfig, FrameReply, Queued, ResetRequest, ResumeOk, ResumeRequest

SEED = 77


async def _connect(url: str):
    ws = await websockets.connect(url, max_size=None)
    config = decode_reply(await ws.recv())
    assert isinstance(config, CameraServerConfig), config
    return ws, config


async def _frame(ws, timeout_s: float, wait: Optional[LineWait] = None):
    """The next reply that answers a request: notices skipped, `queued` ones (the session waits
    in the server's line; one comes at least every 5 s) told to `wait`."""
    while True:
        reply = decode_reply(await asyncio.wait_for(ws.recv(), timeout_s))
        if isinstance(reply, Queued):
            if wait is not None:
                wait.notice(reply)
        elif not getattr(reply, "is_notice", False):
            return reply


async def _play(ws, messages: list[bytes], videos: dict[int, bytes], sent: int, until: int,
                timeout_s: float, t0: Optional[float] = None, debug: Optional[list] = None,
                wait: Optional[LineWait] = None) -> tuple[int, Optional[float], Optional[str]]:
    """Send the session's infers (at most 2 in flight) from chunk `sent` and collect frame
    replies into `videos` until it holds `until`: (chunks sent, seconds from `t0` (default:
    now) to the first reply, the resume token seen); each reply's `debug` (and `at`: when it came)
    appended to `debug`; `wait`: the session's wait in the server's line, ended by its first frame."""
    t0, first_s, token = time.perf_counter() if t0 is None else t0, None, None
    while len(videos) < until:
        while sent < len(messages) and sent - len(videos) < 2:
            await ws.send(messages[sent])
            sent += 1
        reply = await _frame(ws, timeout_s, wait)
        assert isinstance(reply, FrameReply), reply
        if wait is not None:
            wait.served()
        first_s = first_s if first_s is not None else time.perf_counter() - t0
        videos[reply.chunk_id] = reply.video
        token = token or reply.resume_token
        if debug is not None:
            debug.append({**(reply.debug or {}), "at": time.perf_counter()})
    return sent, first_s, token


async def _reset_and_close(ws, sid: str, timeout_s: float) -> None:
    await ws.send(encode(ResetRequest(session_id=sid)))
    await _frame(ws, timeout_s)
    await ws.close()


@asynccontextmanager
async def _socket(url: str, sid: str):
    """A socket for session `sid` (and the handshake); a failure (or SIGTERM: `run_to_end`) resets
    the session before the socket closes: none stays parked, holding its seat from the next run."""
    ws, config = await _connect(url)
    try:
        yield ws, config
    except BaseException:
        with contextlib.suppress(Exception):
            await ws.send(encode(ResetRequest(session_id=sid)))
        raise
    finally:
        await ws.close()


async def reference(url: str, messages: list[bytes], sid: str, timeout_s: float) -> tuple[list[bytes], dict]:
    """The uninterrupted session: its chunks' videos and its wait in the server's line."""
    wait = LineWait()
    async with _socket(url, sid) as (ws, _):
        videos: dict[int, bytes] = {}
        await _play(ws, messages, videos, 0, len(messages), timeout_s, wait=wait)
        await _reset_and_close(ws, sid, timeout_s)
    return [videos[k] for k in range(len(messages))], wait.report()


async def dropped(url: str, messages: list[bytes], sid: str, drop_after: int, timeout_s: float) -> dict:
    wait = LineWait()
    async with _socket(url, sid) as (ws, config):
        videos: dict[int, bytes] = {}
        sent, _, token = await _play(ws, messages, videos, 0, drop_after + 1, timeout_s, wait=wait)
        in_flight = sent - len(videos)
        t_drop = time.perf_counter()
    assert token is not None, "the server issued no resume_token (resume_grace_s 0?)"
    async with _socket(url, sid) as (ws, _):
        t_connect = time.perf_counter()
        await ws.send(encode(ResumeRequest(session_id=sid, resume_token=token, resume_from=len(videos))))
        replayed, first_frame_s = 0, None
        while not isinstance(reply := await _frame(ws, timeout_s), ResumeOk):
            assert isinstance(reply, FrameReply), reply
            first_frame_s = first_frame_s if first_frame_s is not None else time.perf_counter() - t_connect
            videos[reply.chunk_id] = reply.video
            replayed += 1
        _, first_after, _ = await _play(ws, messages, videos, reply.next_chunk_id, len(messages), timeout_s,
                                        t_connect)
        first_frame_s = first_frame_s if first_frame_s is not None else first_after
        await _reset_and_close(ws, sid, timeout_s)
    return {"videos": [videos[k] for k in range(len(messages))], "in_flight_at_drop": in_flight,
            "replayed": replayed, "reconnect_s": t_connect - t_drop, "first_frame_after_connect_s": first_frame_s,
            "resume_grace_s": config.resume_grace_s, "line": wait.report()}


def kill_dit_replica(app: str, replica: Optional[str]) -> str:
    """`ray.kill` APP's DiT replica `replica` (its unique id; None: the application's only one)
    through the Ray instance of this machine; returns the actor's name."""
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", logging_level="ERROR")
    prefix = f"{app}#DiTDeployment#"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
              if prefix in a["name"] and (replica is None or a["name"].endswith(f"{prefix}{replica}"))]
    if len(actors) != 1:
        raise SystemExit(f"no single DiT replica actor *{prefix}{replica or '*'}: {[a['name'] for a in actors]}")
    ray.kill(ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"]), no_restart=True)
    return actors[0]["name"]


async def killed(url: str, messages: list[bytes], sid: str, kill_after: int, timeout_s: float, app: str) -> dict:
    """The session with its DiT replica killed once chunk `kill_after` arrived (the next in flight)."""
    wait = LineWait()
    async with _socket(url, sid) as (ws, _):
        videos: dict[int, bytes] = {}
        debug: list[dict] = []
        sent, _, _ = await _play(ws, messages, videos, 0, kill_after + 1, timeout_s, debug=debug, wait=wait)
        in_flight = sent - len(videos)
        t_kill = time.perf_counter()
        actor = await asyncio.to_thread(kill_dit_replica, app, debug[-1].get("dit_replica"))
        _, first_s, _ = await _play(ws, messages, videos, sent, len(messages), timeout_s, t_kill, debug=debug)
        await _reset_and_close(ws, sid, timeout_s)
    after = debug[kill_after + 1:]  # the replies after the kill, in order: the rebuild shows as one long gap
    return {"videos": [videos[k] for k in range(len(messages))], "killed": actor, "in_flight_at_kill": in_flight,
            "first_frame_after_kill_s": first_s, "frames_after_kill_s": [round(d["at"] - t_kill, 3) for d in after],
            "recoveries": debug[-1].get("recoveries"), "line": wait.report()}


async def _against_reference(args: argparse.Namespace, tag: str, label: str, prefix_cache: Optional[bool],
                             play: Callable[[list[bytes], str], Awaitable[dict]]) -> dict:
    """An uninterrupted reference session, then the same session (trajectory, seed) played by
    `play(messages, session_id)`; its run with each chunk's bytes compared with the reference's."""
    traj = synthetic_trajectory(args.trajectory, args.frames, prompt=f"{DEFAULT_PROMPT} ({label})")
    plan = plan_session(traj, args.frames)
    ref_id, sid = f"drill-ref-{tag}", f"drill-{tag}"

    def messages(session_id: str) -> list[bytes]:
        return traj.messages(plan, session_id, seed=SEED, prefix_cache=prefix_cache)

    ref, ref_line = await reference(args.url, messages(ref_id), ref_id, args.timeout_s)
    run = await play(messages(sid), sid)
    videos = run.pop("videos")
    line = {"reference": ref_line, "session": run.pop("line")}  # each one's wait in the server's line
    return {**run, "chunks": len(ref), "identical_chunks": sum(a == b for a, b in zip(videos, ref)),
            "all_identical": videos == ref, "line": line,
            "queued_s": round(sum(w["queued_s"] for w in line.values()), 3)}


STORES = {"off": False, "on": None}  # the sessions' prefix_cache option (None: the server's default)


async def drill(args: argparse.Namespace) -> dict:
    runs = {}
    for store in args.stores:  # dropped and resumed, the prefix store off or on
        runs[f"store_{store}"] = await _against_reference(
            args, store, f"resume drill, store {store}", STORES[store],
            lambda messages, sid: dropped(args.url, messages, sid, args.drop_after, args.timeout_s))
    if args.kill_app:  # the DiT replica killed mid-session (both sessions out of the store)
        runs["kill"] = await _against_reference(
            args, "kill", "recovery drill", False,
            lambda messages, sid: killed(args.url, messages, sid, args.drop_after, args.timeout_s, args.kill_app))
    return {"frames": args.frames, "drop_after_chunk": args.drop_after, **runs,
            "all_identical": all(r["all_identical"] for r in runs.values()),
            "queued_s": round(sum(r["queued_s"] for r in runs.values()), 3)}


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--frames", type=int, default=57)
    p.add_argument("--drop-after", type=int, default=1, help="close the socket once this chunk arrived")
    p.add_argument("--trajectory", default="dolly", choices=["orbit", "dolly", "pan"])
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--stores", nargs="*", choices=list(STORES), default=list(STORES),
                   help="the prefix store's modes to drill, in order (default: off, then on; none: only --kill-app)")
    p.add_argument("--kill-app", default="", help="then kill the DiT replica of this Serve application mid-session")
    p.add_argument("--out", type=Path, default=Path("resume_drill.json"))
    args = p.parse_args(argv)
    result = run_to_end(drill(args))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
