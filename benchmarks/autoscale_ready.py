"""A DiT replica started by the autoscaler, timed through the real server (issue 35.1: "a replica
started by the autoscaler is ready in the same time").

    python -m benchmarks.autoscale_ready --url ws://HOST:8000/v1/realtime/world/camera --out autoscale.json

Against an app whose DiT autoscales by held sessions (deployments/autoscaling_policy.py) and
runs at its min_replicas, each replica full with one session (`sessions.max_sessions: 1`, e.g.
benchmarks/serve_config.h200.autoscale_fp8.yaml): session A takes the one slot (its first
chunk), session B's first infer is answered `busy` (the moment the policy asks for one replica
more), B retries it every --retry-s until a frame comes. On a server with a waiting line B is
not answered `busy` but waits in it (`queued`) until the new replica takes it: `busy_at` is then
when B's first infer was sent, `tries` 1 and `line` its wait (benchmarks/line/wait.py). The new replica's own record (its
stats' `ready`, model/ready.py: constructor start, load, warm-up per size with torch.compile's
share, compile-cache hits) is placed on that time line:

* `busy_to_constructor_s`: the controller's decision, the replica's process and its imports;
* `constructor_s`: load + warm-up (+ cache save) of the new replica, beside the first one's;
* `busy_to_ready_s`, `busy_to_first_frame_s`: until it serves, and until B has its frame.

Written: the JSON (--out) and a summary on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from benchmarks.line.wait import LineWait
from benchmarks.serve_load import http_base, model_card
from client.session import WorldClient
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply

READY = ("started_at", "ready_at", "load_s", "warmup_s", "compile_s", "total_s", "warmup_per_size", "compile_cache")


def _first_infer(args: argparse.Namespace, session_id: str) -> bytes:
    """A session's first infer, its prompt tagged with the session and the run: never served
    from a prefix store (B repeating A's inputs would get A's chunk with no DiT call)."""
    tag = f"{session_id} {uuid.uuid4().hex[:8]}"
    traj = synthetic_trajectory("dolly", 33, prompt=f"{DEFAULT_PROMPT} (autoscale bench {tag})")
    return traj.messages(plan_session(traj, 33), session_id, seed=7, size=args.size, open_ended=True)[0]


def dit_replicas(args: argparse.Namespace) -> dict[str, dict]:
    """The DiT replicas /v1/models lists now, by replica id (their stats)."""
    card = model_card(http_base(args.url), args.api_key)
    return {s.get("replica") or str(i): s for i, s in enumerate(card["replicas"]["dit"])}


def _ready(stats: dict) -> dict[str, Any]:
    return {k: v for k, v in (stats.get("ready") or {}).items() if k in READY}


async def _until_one_replica(args: argparse.Namespace) -> dict[str, dict]:
    """Wait until the DiT runs a single replica (an earlier scale-up gone), its stats."""
    deadline = time.monotonic() + args.settle_timeout_s
    while len(replicas := dit_replicas(args)) != 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the DiT did not come down to one replica: {sorted(replicas)}")
        await asyncio.sleep(1.0)
    return replicas


async def run(args: argparse.Namespace) -> dict[str, Any]:
    before = await _until_one_replica(args)
    (first_id, first), = before.items()
    t = args.reply_timeout_s
    async with await WorldClient.connect(args.url, api_key=args.api_key) as a, \
            await WorldClient.connect(args.url, api_key=args.api_key) as b:
        await a.send(_first_infer(args, "as-a"))
        reply = await a.receive(t)
        if not isinstance(reply, FrameReply):
            raise RuntimeError(f"session A: expected a frame, got {reply!r}"[:400])
        infer_b = _first_infer(args, "as-b")
        wait = LineWait().watch(b)  # a server with a line: B waits in it (notices every few s) for the new replica
        busy_at = time.time()
        await b.send(infer_b)
        async with asyncio.timeout(args.scale_timeout_s):
            reply = await b.receive(t)
        queued = isinstance(reply, FrameReply) and wait.notices > 0
        if not queued and not (isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY):
            raise RuntimeError(f"session B: expected `busy` or `queued` (is the DiT replica full with one session?), "
                               f"got {reply!r}"[:400])
        wait.served()
        tries, frame_at = 1, time.time()
        deadline = time.monotonic() + args.scale_timeout_s
        while not queued:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no frame for B {args.scale_timeout_s} s after `busy` ({tries} tries)")
            await asyncio.sleep(args.retry_s)
            await b.send(infer_b)
            tries += 1
            reply = await b.receive(t)
            if isinstance(reply, FrameReply):
                frame_at = time.time()
                break
            if not (isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY):
                raise RuntimeError(f"session B: expected a frame or `busy`, got {reply!r}"[:400])
        b_ttfc = reply.stage_durations.get("total")
        after = dit_replicas(args)
        await b.reset("as-b")
        await a.reset("as-a")
    new = [s for rid, s in after.items() if rid not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one new DiT replica, found {sorted(after)} (before: {sorted(before)})")
    ready = _ready(new[0])
    out: dict[str, Any] = {
        "busy_at": busy_at, "tries": tries, "retry_s": args.retry_s, "line": wait.report(),
        "first_replica": {"replica": first_id, **_ready(first)},
        "new_replica": {"replica": new[0].get("replica"), **ready},
        "busy_to_first_frame_s": round(frame_at - busy_at, 3),
        "b_first_chunk_server_s": b_ttfc,
    }
    if "started_at" in ready:
        out["busy_to_constructor_s"] = round(ready["started_at"] - busy_at, 3)
        out["busy_to_ready_s"] = round(ready["ready_at"] - busy_at, 3)
        out["constructor_s"] = {"first": _ready(first).get("total_s"), "new": ready.get("total_s")}
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--size", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--retry-s", type=float, default=0.5, help="B's retry interval after `busy`")
    p.add_argument("--reply-timeout-s", type=float, default=120.0)
    p.add_argument("--scale-timeout-s", type=float, default=300.0, help="how long B waits for the new replica")
    p.add_argument("--settle-timeout-s", type=float, default=120.0, help="how long to wait for one DiT replica first")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2, default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    keys = ("busy_to_constructor_s", "constructor_s", "busy_to_ready_s", "busy_to_first_frame_s", "tries")
    print(json.dumps({k: result.get(k) for k in keys}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
