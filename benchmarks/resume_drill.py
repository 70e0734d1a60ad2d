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
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Optional

import websockets

from client.trajectory import plan_session
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from protocol import decode_reply, encode
from protocol.messages import CameraServerConfig, FrameReply, ResetRequest, ResumeOk, ResumeRequest

SEED = 77


async def _connect(url: str):
    ws = await websockets.connect(url, max_size=None)
    config = decode_reply(await ws.recv())
    assert isinstance(config, CameraServerConfig), config
    return ws, config


async def _frame(ws, timeout_s: float):
    reply = decode_reply(await asyncio.wait_for(ws.recv(), timeout_s))
    if getattr(reply, "is_notice", False):
        return await _frame(ws, timeout_s)
    return reply


async def _play(ws, messages: list[bytes], videos: dict[int, bytes], sent: int, until: int,
                timeout_s: float, t0: Optional[float] = None) -> tuple[int, Optional[float], Optional[str]]:
    """Send the session's infers (at most 2 in flight) from chunk `sent` and collect frame
    replies into `videos` until it holds `until`: (chunks sent, seconds from `t0` (default:
    now) to the first reply, the resume token seen)."""
    t0, first_s, token = time.perf_counter() if t0 is None else t0, None, None
    while len(videos) < until:
        while sent < len(messages) and sent - len(videos) < 2:
            await ws.send(messages[sent])
            sent += 1
        reply = await _frame(ws, timeout_s)
        assert isinstance(reply, FrameReply), reply
        first_s = first_s if first_s is not None else time.perf_counter() - t0
        videos[reply.chunk_id] = reply.video
        token = token or reply.resume_token
    return sent, first_s, token


async def _reset_and_close(ws, sid: str, timeout_s: float) -> None:
    await ws.send(encode(ResetRequest(session_id=sid)))
    await _frame(ws, timeout_s)
    await ws.close()


async def reference(url: str, messages: list[bytes], sid: str, timeout_s: float) -> list[bytes]:
    ws, _ = await _connect(url)
    videos: dict[int, bytes] = {}
    await _play(ws, messages, videos, 0, len(messages), timeout_s)
    await _reset_and_close(ws, sid, timeout_s)
    return [videos[k] for k in range(len(messages))]


async def dropped(url: str, messages: list[bytes], sid: str, drop_after: int, timeout_s: float) -> dict:
    ws, config = await _connect(url)
    videos: dict[int, bytes] = {}
    sent, _, token = await _play(ws, messages, videos, 0, drop_after + 1, timeout_s)
    in_flight = sent - len(videos)
    t_drop = time.perf_counter()
    await ws.close()
    assert token is not None, "the server issued no resume_token (resume_grace_s 0?)"
    ws, _ = await _connect(url)
    t_connect = time.perf_counter()
    await ws.send(encode(ResumeRequest(session_id=sid, resume_token=token, resume_from=len(videos))))
    replayed, first_frame_s = 0, None
    while not isinstance(reply := await _frame(ws, timeout_s), ResumeOk):
        assert isinstance(reply, FrameReply), reply
        first_frame_s = first_frame_s if first_frame_s is not None else time.perf_counter() - t_connect
        videos[reply.chunk_id] = reply.video
        replayed += 1
    _, first_after, _ = await _play(ws, messages, videos, reply.next_chunk_id, len(messages), timeout_s, t_connect)
    first_frame_s = first_frame_s if first_frame_s is not None else first_after
    await _reset_and_close(ws, sid, timeout_s)
    return {"videos": [videos[k] for k in range(len(messages))], "in_flight_at_drop": in_flight,
            "replayed": replayed, "reconnect_s": t_connect - t_drop, "first_frame_after_connect_s": first_frame_s,
            "resume_grace_s": config.resume_grace_s}


STORES = {"off": False, "on": None}  # the sessions' prefix_cache option (None: the server's default)


async def drill_one(args: argparse.Namespace, store: str) -> dict:
    """The reference and the dropped session with the prefix store `store` ("off" or "on")."""
    traj = synthetic_trajectory(args.trajectory, args.frames, prompt=f"{DEFAULT_PROMPT} (resume drill, store {store})")
    plan = plan_session(traj, args.frames)
    ref_id, sid = f"drill-ref-{store}", f"drill-{store}"

    def messages(session_id: str) -> list[bytes]:
        return traj.messages(plan, session_id, seed=SEED, prefix_cache=STORES[store])

    ref = await reference(args.url, messages(ref_id), ref_id, args.timeout_s)
    run = await dropped(args.url, messages(sid), sid, args.drop_after, args.timeout_s)
    videos = run.pop("videos")
    return {**run, "chunks": len(ref), "identical_chunks": sum(a == b for a, b in zip(videos, ref)),
            "all_identical": videos == ref}


async def drill(args: argparse.Namespace) -> dict:
    runs = {f"store_{store}": await drill_one(args, store) for store in args.stores}
    return {"frames": args.frames, "drop_after_chunk": args.drop_after, **runs,
            "all_identical": all(r["all_identical"] for r in runs.values())}


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--frames", type=int, default=57)
    p.add_argument("--drop-after", type=int, default=1, help="close the socket once this chunk arrived")
    p.add_argument("--trajectory", default="dolly", choices=["orbit", "dolly", "pan"])
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--stores", nargs="+", choices=list(STORES), default=list(STORES),
                   help="the prefix store's modes to drill, in order (default: off, then on)")
    p.add_argument("--out", type=Path, default=Path("resume_drill.json"))
    args = p.parse_args(argv)
    result = asyncio.run(drill(args))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
