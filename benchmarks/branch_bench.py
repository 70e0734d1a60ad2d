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

from benchmarks.serve_load import http_base, model_card, replica_report
from client.session import WorldClient
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol.codec import encode
from protocol.messages import ErrorReply, Forked, ForkRequest, FrameReply, Rewound, RewindRequest

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


async def _stream(client: WorldClient, messages: list[bytes], pipeline: int, timeout_s: float) -> tuple[
        list[FrameReply], list[float]]:
    """Send `messages` with `pipeline` in flight: the replies and their arrival times (from the first send)."""
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
    return replies, times


def _dit(replies: list[FrameReply]) -> list[float]:
    return [r.stage_durations.get("dit", 0.0) for r in replies[1:]]


async def _answer(client: WorldClient, kind: type, timeout_s: float) -> Any:
    reply = await client.receive(timeout_s)
    if isinstance(reply, ErrorReply) or not isinstance(reply, kind):
        raise RuntimeError(f"expected `{kind.__name__}`, got {reply!r}"[:400])
    return reply


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n, t = args.chunks, args.reply_timeout_s
    out: dict[str, Any] = {"chunks": n, "pipeline": args.pipeline, "size": args.size}
    tag = uuid.uuid4().hex[:8]
    msgs_a, msgs_b, msgs_f, msgs_g = (_messages(args, sid, tag) for sid in ("bb-a", "bb-b", "bb-f", "bb-g"))
    async with await WorldClient.connect(args.url, api_key=args.api_key) as a:
        out["model"] = a.config.model
        started = time.perf_counter()
        cold, cold_t = await _stream(a, msgs_a[:n], args.pipeline, t)
        steps = _dit(cold)
        out["cold"] = {"ttfc_s": cold_t[0], "wall_s": time.perf_counter() - started,
                       "dit_step_mean_s": float(np.mean(steps)) if steps else None,
                       "vae_decode_mean_s": float(np.mean([r.stage_durations.get("vae_decode", 0.0) for r in cold]))}

        async with await WorldClient.connect(args.url, api_key=args.api_key) as b:
            t_b = time.perf_counter()
            hit, hit_t = await _stream(b, msgs_b[:n], args.pipeline, t)
            out["hit"] = {"ttfc_s": hit_t[0], "wall_s": time.perf_counter() - t_b,
                          "cached": sum(bool(getattr(r, "cached", False)) for r in hit),
                          "video_equal": sum(x.video == y.video for x, y in zip(cold, hit))}
            await b.reset("bb-b")

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

        half = n // 2
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

    msgs_d = _messages(args, "bb-d", tag)
    async with await WorldClient.connect(args.url, api_key=args.api_key) as d:
        calls_before = _clone_calls(args)
        served, _ = await _stream(d, msgs_d[:half], args.pipeline, t)
        t_d = time.perf_counter()
        await d.send(msgs_d[n])  # the continuation's cameras as chunk `half`: a path no session took
        computed = await _frame(d, t)
        out["leave"] = {"at_chunk": half, "cached": sum(bool(getattr(r, "cached", False)) for r in served),
                        "first_computed_s": time.perf_counter() - t_d, "frame_dit_s": computed.stage_durations.get("dit"),
                        "path": _paths(calls_before, _clone_calls(args), "snapshot")}
        await d.reset("bb-d")
    out["replicas"] = replica_report(http_base(args.url), args.api_key)
    return out


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
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2, default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    summary = {k: result.get(k) for k in ("cold", "hit", "fork", "fork_below", "rewind", "leave", "snapshots")}
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
