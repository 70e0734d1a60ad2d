"""Branching worlds through the real server (issue 33): a prefix hit, a fork and a rewind, timed.

    python -m benchmarks.branch_bench --url ws://HOST:8000/v1/realtime/world/camera \\
        --chunks 20 --out branch.json

One run, six phases on a synthetic open-ended dolly (one chunk more than --chunks is planned:
the continuation the forks and the rewind send):
1. **cold**: session A streams --chunks chunks (--pipeline in flight). TTFC, DiT step per chunk.
2. **hit**: session B on a second socket sends A's inputs (same image, prompt, seed, poses):
   TTFC, how many replies say `cached`, and whether each chunk's video bytes equal A's. Without
   a prefix store (or with it off) this is a second cold session. (The prompt carries a tag of
   the run: A is never served from the store by an earlier run.)
3. **rewind**: right after, A rewound to its last chunk, an undo (`rewind` -> `rewound`), the
   chunk sent again: time to `rewound`, to the frame, whether its video equals the original
   (CPU float32: equal by design; GPU bf16: reported, not asserted), and its path (`snapshot`:
   the copy a replica made before that chunk, kept even where the spare bytes hold one; else
   `replay`).
4. **fork**: A is forked at its last chunk into F (`fork` -> `forked`), then F's next chunk:
   time to `forked` and from the fork request to F's first frame, against A's mean DiT step
   (issue 33: within one DiT step + 0.3 s), and the path it took: `clone` (the replica holding A
   copied its live state) or `replay` (the journal's chunks replayed), per deployment, from the
   replicas' `clone` call counts before and after (/v1/models; null when unreadable). A then
   makes its own chunk --chunks with F's cameras: `video_equal_to_parent` (a copy of live
   state continues exactly: equal on the CPU by design, on a GPU as far as its kernels repeat).
5. **fork_below**: A forked at chunk --chunks // 2 into G, G's next chunk (chunk --chunks - 1's
   cameras): as the fork, from a replica's snapshot of A after that chunk where they keep one
   (`prefix_cache.snapshot_mib`; path `snapshot`), else the journal's replay (`replay`).
6. **leave**: session D on a new socket sends A's first --chunks // 2 inputs (served from the
   store) and then the continuation: the time of its first computed chunk (the session is made
   on the replicas then: from the snapshot of A that the stored chunk names, else by replay).
The replicas' snapshot figures (held, bytes: one session's state per snapshot) are reported.

On a server of one seat (`sessions.capacity` 1 in /v1/models: serve_config.gpu.yaml) the parts
that hold two sessions at once cannot run: the forks (a fork never waits in line; it would be
answered `busy`) are skipped, `fork` and `fork_below` saying why (`skipped`), and the hit runs
after A is reset (`after_cold_reset`: A's chunks stay in the store; beside A, B would wait in
line behind it for good where the store does not serve it). A session that waits in the
server's line records its wait (`line`: per session a, b, d, `queued_s` and its notices,
benchmarks/line/wait.py); `seats` is the count read. Every session is reset before its socket
closes, also when a phase fails or SIGTERM ends the run (gpu_serve.sh's `timeout`): none is
left parked for the resume grace, holding the seat the next benchmark needs.
Written: the JSON (--out) and a summary on stdout. Definitions as benchmarks/serve_load.py.
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

import numpy as np

from benchmarks.line.wait import LineWait
from benchmarks.line.seats import needs_seats, run_to_end, seats
from benchmarks.serve_load import http_base, model_card, replica_report
from client.session import WorldClient
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol.codec import encode
from protocol.messages import ErrorReply, Forked, ForkRequest, FrameReply, ResetOk, Rewound, RewindRequest

SEED = 7


def _messages(args: argparse.Namespace, session_id: str, run_tag: str) -> list[bytes]:
    """The session's infers; `run_tag` in the prompt: a run's cold session is never served from
    the server's prefix store by an earlier run (its second session is, by this run's first)."""
    frames = 12 * (args.chunks + 1) - 3
    traj = synthetic_trajectory("dolly", frames, prompt=f"{DEFAULT_PROMPT} (branch bench {run_tag})")
    return traj.messages(plan_session(traj, frames), session_id, seed=SEED, size=args.size, open_ended=True)


async def _frame(client: WorldClient, timeout_s: float) -> FrameReply:
    reply = await client.receive(timeout_s)
    if not isinstance(reply, FrameReply):
        raise RuntimeError(f"expected a frame, got {reply!r}"[:400])
    return reply


async def _stream(client: WorldClient, messages: list[bytes], pipeline: int, timeout_s: float,
                  wait: Optional[LineWait] = None) -> tuple[list[FrameReply], list[float]]:
    """Send `messages` with `pipeline` in flight: the replies and their arrival times (from the
    first send); `wait` is told of the first frame (a new session may wait in the server's line)."""
    replies: list[FrameReply] = []
    times: list[float] = []
    t0 = time.perf_counter()
    sent = 0
    while len(replies) < len(messages):
        while sent < len(messages) and sent - len(replies) < pipeline:
            await client.send(messages[sent])
            sent += 1
        replies.append(await _frame(client, timeout_s))
        times.append(time.perf_counter() - t0)
        if wait is not None:
            wait.served()
    return replies, times


def _dit(replies: list[FrameReply]) -> list[float]:
    return [r.stage_durations.get("dit", 0.0) for r in replies[1:]]


async def _answer(client: WorldClient, kind: type, timeout_s: float) -> Any:
    reply = await client.receive(timeout_s)
    if isinstance(reply, ErrorReply) or not isinstance(reply, kind):
        raise RuntimeError(f"expected `{kind.__name__}`, got {reply!r}"[:400])
    return reply


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n, t, half = args.chunks, args.reply_timeout_s, args.chunks // 2
    have = seats(args.url, args.api_key)
    two = needs_seats(2, have)  # the hit's second socket while A is held, and each fork: two sessions at once
    out: dict[str, Any] = {"chunks": n, "pipeline": args.pipeline, "size": args.size, "seats": have, "line": {}}
    tag = uuid.uuid4().hex[:8]
    msgs_a, msgs_b, msgs_f, msgs_g = (_messages(args, sid, tag) for sid in ("bb-a", "bb-b", "bb-f", "bb-g"))
    async with await WorldClient.connect(args.url, api_key=args.api_key) as a:
        try:
            cold = await _with_a(args, a, out, two, msgs_a, msgs_b, msgs_f, msgs_g)
        except BaseException:
            await _release(a, "bb-a", "bb-f", "bb-g")  # none stays parked, holding its seat from the next hook
            raise
    if two is not None:  # one seat: the same inputs on a second socket once A is gone (the store keeps its chunks)
        out["hit"] = {**await _hit(args, msgs_b, cold, out["line"]), "after_cold_reset": True}

    msgs_d = _messages(args, "bb-d", tag)
    async with await WorldClient.connect(args.url, api_key=args.api_key) as d:
        try:
            wait = LineWait().watch(d)
            calls_before = _clone_calls(args)
            served, _ = await _stream(d, msgs_d[:half], args.pipeline, t, wait)
            out["line"]["d"] = wait.report()
            t_d = time.perf_counter()
            await d.send(msgs_d[n])  # the continuation's cameras as chunk `half`: a path no session took
            computed = await _frame(d, t)
            out["leave"] = {"at_chunk": half, "cached": sum(bool(getattr(r, "cached", False)) for r in served),
                            "first_computed_s": time.perf_counter() - t_d,
                            "frame_dit_s": computed.stage_durations.get("dit"),
                            "path": _paths(calls_before, _clone_calls(args), "snapshot")}
            await d.reset("bb-d")
        except BaseException:
            await _release(d, "bb-d")
            raise
    out["replicas"] = replica_report(http_base(args.url), args.api_key)
    return out


async def _with_a(args: argparse.Namespace, a: WorldClient, out: dict[str, Any], two: Optional[str],
                  msgs_a: list[bytes], msgs_b: list[bytes], msgs_f: list[bytes], msgs_g: list[bytes]
                  ) -> list[FrameReply]:
    """Session A's phases: cold, the hit beside it (two seats), the rewind, the forks (two seats);
    A reset at the end; its cold replies. `two`: why the parts that need two seats are skipped
    (None: they run)."""
    n, t, half = args.chunks, args.reply_timeout_s, args.chunks // 2
    out["model"] = a.config.model
    wait = LineWait().watch(a)
    started = time.perf_counter()
    cold, cold_t = await _stream(a, msgs_a[:n], args.pipeline, t, wait)
    out["line"]["a"] = wait.report()
    steps = _dit(cold)
    out["cold"] = {"ttfc_s": cold_t[0], "wall_s": time.perf_counter() - started,
                   "dit_step_mean_s": float(np.mean(steps)) if steps else None,
                   "vae_decode_mean_s": float(np.mean([r.stage_durations.get("vae_decode", 0.0) for r in cold]))}
    if two is None:
        out["hit"] = await _hit(args, msgs_b, cold, out["line"])

    calls_before = _clone_calls(args)
    t_r = time.perf_counter()
    await a.send(encode(RewindRequest(session_id="bb-a", to_chunk=n - 1)))
    await _answer(a, Rewound, t)
    rewound_s = time.perf_counter() - t_r
    await a.send(msgs_a[n - 1])
    again = await _frame(a, t)
    out["rewind"] = {"to_chunk": n - 1, "rewound_s": rewound_s, "rewind_to_frame_s": time.perf_counter() - t_r,
                     "video_equal": again.video == cold[n - 1].video,
                     "path": _paths(calls_before, _clone_calls(args), "snapshot")}
    out["snapshots"] = _snapshots(args)  # while A is held

    if two is not None:  # a fork is a second session beside A: `busy` on one seat (forks never wait in line)
        out["fork"] = {"at_chunk": n, "skipped": two}
        out["fork_below"] = {"at_chunk": half, "skipped": two}
        await a.reset("bb-a")
        return cold
    clones_before = _clone_calls(args)
    t_f = time.perf_counter()
    await a.send(encode(ForkRequest(session_id="bb-a", new_session_id="bb-f", at_chunk=n)))
    await _answer(a, Forked, t)
    forked_s = time.perf_counter() - t_f
    await a.send(msgs_f[n])
    first = await _frame(a, t)
    fork_to_frame = time.perf_counter() - t_f
    step = out["cold"]["dit_step_mean_s"]
    out["fork"] = {"at_chunk": n, "forked_s": forked_s, "fork_to_frame_s": fork_to_frame,
                   "frame_dit_s": first.stage_durations.get("dit"),
                   "target_s": step + 0.3 if step is not None else None,
                   "path": _paths(clones_before, _clone_calls(args))}
    await a.reset("bb-f")
    await a.send(msgs_a[n])  # A's own chunk n, the same cameras as F's: the copy's chunk must equal it
    out["fork"]["video_equal_to_parent"] = (await _frame(a, t)).video == first.video

    calls_before = _clone_calls(args)
    t_g = time.perf_counter()
    await a.send(encode(ForkRequest(session_id="bb-a", new_session_id="bb-g", at_chunk=half)))
    await _answer(a, Forked, t)
    forked_s = time.perf_counter() - t_g
    await a.send(msgs_g[n - 1])  # chunk n - 1's cameras as chunk `half` (D's path stays unstored)
    first = await _frame(a, t)
    out["fork_below"] = {"at_chunk": half, "forked_s": forked_s, "fork_to_frame_s": time.perf_counter() - t_g,
                         "frame_dit_s": first.stage_durations.get("dit"),
                         "target_s": step + 0.3 if step is not None else None,
                         "path": _paths(calls_before, _clone_calls(args), "snapshot")}
    await a.reset("bb-g")
    await a.reset("bb-a")
    return cold


async def _hit(args: argparse.Namespace, msgs_b: list[bytes], cold: list[FrameReply],
               line: dict[str, Any]) -> dict[str, Any]:
    """Session B on a second socket sends A's inputs: served from the store where it has them."""
    n, t = args.chunks, args.reply_timeout_s
    async with await WorldClient.connect(args.url, api_key=args.api_key) as b:
        try:
            wait = LineWait().watch(b)
            t_b = time.perf_counter()
            hit, hit_t = await _stream(b, msgs_b[:n], args.pipeline, t, wait)
            line["b"] = wait.report()
            await b.reset("bb-b")
        except BaseException:
            await _release(b, "bb-b")
            raise
    return {"ttfc_s": hit_t[0], "wall_s": time.perf_counter() - t_b,
            "cached": sum(bool(getattr(r, "cached", False)) for r in hit),
            "video_equal": sum(x.video == y.video for x, y in zip(cold, hit))}


RELEASE_TIMEOUT_S = 5.0


async def _release(client: WorldClient, *sids: str) -> None:
    """Reset `sids` on a socket a failure (or SIGTERM) ends: a session whose socket closes without
    a reset stays parked for the server's `sessions.resume.grace_s`, holding its seat from the
    benchmark after this one. Best effort: what fails here leaves the original error standing."""
    try:
        for sid in sids:
            await client.send_reset(sid)
        async with asyncio.timeout(RELEASE_TIMEOUT_S):
            while not (isinstance(r := await client.receive(), ResetOk) and r.session_id == sids[-1]):
                pass
    except Exception:  # noqa: BLE001 - the socket may be gone already
        pass


COPY_CALLS = ("clone", "from_snapshot")  # a replica's copies: of a live session, of a snapshot (the VAE's)


def _clone_calls(args: argparse.Namespace) -> Optional[dict[str, int]]:
    """Copies each stateful deployment's replicas made so far (their stats' `clone` and
    `from_snapshot` calls); None when unreadable."""
    try:
        card = model_card(http_base(args.url), args.api_key)
        return {name: sum(r.get("calls", {}).get(c, 0) for r in card["replicas"][name] for c in COPY_CALLS)
                for name in ("dit", "vae")}
    except Exception:  # noqa: BLE001 - a report, not a failure of the run
        return None


def _snapshots(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """The replicas' snapshot figures (held, bytes, taken, evicted) and the bytes of one."""
    try:
        card = model_card(http_base(args.url), args.api_key)
    except Exception:  # noqa: BLE001
        return None
    out: dict[str, Any] = {}
    for name in ("dit", "vae"):
        shelves = [r.get("snapshots") or {} for r in card["replicas"][name]]
        held, nbytes = sum(s.get("held", 0) for s in shelves), sum(s.get("bytes", 0) for s in shelves)
        out[name] = {"held": held, "bytes": nbytes, "taken": sum(s.get("taken", 0) for s in shelves),
                     "evicted": sum(s.get("evicted", 0) for s in shelves),
                     "mib_per_snapshot": nbytes / held / 2**20 if held else None}
    return out


def _paths(before: Optional[dict[str, int]], after: Optional[dict[str, int]],
           copy: str = "clone") -> Optional[dict[str, str]]:
    """Per deployment, how the session was built: `copy` (`clone`: of the live session,
    `snapshot`: of a replica's snapshot) when its replicas made one more copy, else `replay`."""
    if before is None or after is None:
        return None
    return {name: copy if after[name] > before[name] else "replay" for name in before}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--chunks", type=int, default=20, help="chunks of the cold session (the fork's at_chunk)")
    p.add_argument("--pipeline", type=int, default=2)
    p.add_argument("--size", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--reply-timeout-s", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.chunks < 2:
        p.error("--chunks must be at least 2")
    result = run_to_end(run(args))
    text = json.dumps(result, indent=2, default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    summary = {k: result.get(k) for k in ("seats", "line", "cold", "hit", "fork", "fork_below", "rewind", "leave",
                                            "snapshots")}
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
