"""The serving benchmark: N concurrent WebSocket sessions through the real server.

    python -m benchmarks.serve_load --url ws://HOST:8000/v1/realtime/world/camera \\
        --sessions 1 2 4 --frames 81 --out serve_load.json
    python -m benchmarks.serve_load --drive --presses 8 --hold-chunks 3 --pause-s 3 --out drive.json
        (a driven session's control lag instead: benchmarks/drive_load.py)
    python -m benchmarks.serve_load --arrival-rate 6 --duration-s 600 --out arrivals.json
        (sessions arriving at random, waiting in the server's line: benchmarks/line/arrivals.py)

For each N of --sessions (one "run" after the other) it opens N sockets at once and streams one
session on each (`WorldClient` + `stream_session`, a synthetic trajectory, the session's
length declared with num_frames unless --open-ended: then the sessions are open-ended and
run the server's rolling window where it has one; up to --pipeline chunks in flight, a distinct prompt per
session so that the text encoder's cache hides nothing). It records every chunk's arrival and
the `stage_durations` of its reply, and reads each replica's stats from /v1/models after the
run (peak memory, memory cap, session budget, warmed sizes). Written: the JSON (after every
run), a table on stdout, and a PNG of each session's chunk intervals and time to first chunk
over time (matplotlib; `--plot-from JSON` draws it later on another machine).

Definitions (seconds, the client's clock):
* TTFC: session start (before connecting) to its first frame reply. The first session after
  the server started (run 0, session 0) is reported apart: it would show a missing warm-up.
* chunk interval: between consecutive frame replies of one session.
* DiT step: the replica's own time for the chunk (`stage_durations.dit`); serving overhead =
  mean chunk interval - mean DiT step (meaningful for one session; with N sessions on one
  DiT replica the interval includes the other sessions' steps).
* aggregate frames/s: video frames of all sessions of the run / (last reply - run start).
* busy: sessions refused with `busy` (with --busy-timeout-s 0 a refused session gives up; a
  larger value makes it retry until admitted).
* queued: a session that found every seat taken waits in the server's line (`queued` notices)
  and starts by itself; `queued_s` (benchmarks/line/wait.py): its first notice to its first
  frame. Its TTFC includes the wait (more sessions than seats measure the line, not the model).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from benchmarks import drive_load
from benchmarks.line.wait import LineWait
from benchmarks.served import stream_synthetic
from benchmarks.line import arrivals
from client.errors import ServerError
from client.session import CAMERA_PATH, camera_url
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol.errors import ErrorCode

STAGES = ("text_encode", "vae_encode", "dit", "vae_decode", "mux", "queue_wait", "total")
GIB = 1024**3


@dataclass
class ChunkRecord:
    index: int
    received_s: float  # since the run started
    num_frames: int
    stage_durations: dict[str, float]
    cached: bool = False  # from the server's prefix store: not the model's work (`cached_chunks`)


@dataclass
class SessionRecord:
    run: int
    index: int
    session_id: str
    started_s: float  # since the run started
    ttfc_s: Optional[float] = None
    chunks: list[ChunkRecord] = field(default_factory=list)
    busy_replies: int = 0
    refused: bool = False  # gave up on `busy`
    error: Optional[str] = None
    reset_s: Optional[float] = None  # the final reset's round trip (the server frees the session)
    wait: LineWait = field(default_factory=LineWait)  # its wait in the server's line (none: queued_s 0)

    @property
    def intervals(self) -> list[float]:
        t = [c.received_s for c in self.chunks]
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def frames(self) -> int:
        return sum(c.num_frames for c in self.chunks)


def http_base(url: str) -> str:
    """The HTTP root of the app whose camera route is `url` (its route prefix kept: `/v1/models`
    of an app served at /prefix is /prefix/v1/models)."""
    parts = urlsplit(camera_url(url))
    path = parts.path.rstrip("/")
    prefix = path[: -len(CAMERA_PATH)] if path.endswith(CAMERA_PATH) else ""
    return urlunsplit(("https" if parts.scheme == "wss" else "http", parts.netloc, prefix, "", ""))


def get_json(url: str, api_key: Optional[str] = None, timeout_s: float = 30.0) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def model_card(base: str, api_key: Optional[str] = None) -> dict[str, Any]:
    """The served model's card from /v1/models of the app at `base` (its replicas' stats under
    `replicas`, by deployment)."""
    return get_json(f"{base}/v1/models", api_key)["data"][0]


def replica_report(base: str, api_key: Optional[str]) -> dict[str, Any]:
    """Per deployment, what each replica reports (from /v1/models)."""
    try:
        card = model_card(base, api_key)
    except Exception as e:  # noqa: BLE001 - a report, not a failure of the run
        return {"error": f"{type(e).__name__}: {e}"}
    keys = ("replica", "sessions", "capacity", "peak_memory_bytes", "peak_memory_kind", "memory_allocated_bytes",
            "memory_reserved_bytes", "memory_cap_bytes", "budget_bytes", "resident_bytes", "cache_bytes",
            "reserved_bytes", "warmed_sizes", "warmup_s", "random_weights", "rss_bytes")
    replicas = {name: [{k: s[k] for k in keys if k in s} for s in stats]
                for name, stats in card.get("replicas", {}).items()}
    model = {k: card.get(k) for k in ("id", "dtype", "vae_dtype", "kv_cache", "fp8", "device", "local_attn_size", "sink_size",
                                       "default_resolution", "size_buckets", "random_weights")}
    return {"model": model, "sessions": card.get("sessions"), "replicas": replicas}


def invocation_tag() -> str:
    """A token of this invocation in every session's prompt: a server with the prefix store on
    would answer a second invocation's sessions from the first's chunks (the same inputs)."""
    return uuid.uuid4().hex[:8]


async def one_session(args: argparse.Namespace, run: int, index: int, t_run: float) -> SessionRecord:
    sid = f"load-{run}-{index}"
    rec = SessionRecord(run, index, sid, time.perf_counter() - t_run)
    traj = synthetic_trajectory(args.trajectory, args.frames,
                                prompt=f"{DEFAULT_PROMPT} (load session {args.tag}.{run}.{index})")
    plan = plan_session(traj, args.frames)
    messages = traj.messages(plan, sid, size=args.size, open_ended=args.open_ended)
    started = time.perf_counter()

    def on_chunk(stat, reply) -> None:
        now = time.perf_counter()
        if rec.ttfc_s is None:
            rec.ttfc_s = now - started
            rec.wait.served()
        rec.chunks.append(ChunkRecord(stat.index, now - t_run, reply.num_frames, dict(reply.stage_durations),
                                      stat.cached))

    def on_busy(err: ServerError) -> None:
        rec.busy_replies += 1

    out = await stream_synthetic(args.url, args.api_key, sid, messages, rec.wait.notice, pipeline=args.pipeline,
                                 on_chunk=on_chunk,
                                 on_busy=on_busy, busy_timeout_s=args.busy_timeout_s,
                                 reply_timeout_s=args.reply_timeout_s)
    rec.reset_s, e = out.reset_s, out.error
    if e is not None and not out.connected:
        rec.error = f"connect: {type(e).__name__}: {e}"
    elif isinstance(e, ServerError) and e.code is ErrorCode.BUSY:
        rec.busy_replies += 1
        rec.refused = True
    elif e is not None:
        rec.error = f"{e.code.value}: {e.message}" if isinstance(e, ServerError) else f"{type(e).__name__}: {e}"
    return rec


def _pct(values: list[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> Optional[float]:
    return float(np.mean(values)) if values else None


def summarise(sessions: list[SessionRecord], wall_s: float, first_after_start: bool) -> dict[str, Any]:
    done = [s for s in sessions if s.chunks]
    ttfc_pool = [s.ttfc_s for s in done if not (first_after_start and s.index == 0)]
    intervals = [i for s in done for i in s.intervals]
    # chunks after the first: the interval's DiT step (a chunk from the prefix store ran none)
    steady = [c for s in done for c in s.chunks[1:] if not c.cached]
    dit_steady = [c.stage_durations.get("dit", 0.0) for c in steady]
    stages = {k: _mean([c.stage_durations[k] for s in done for c in s.chunks if k in c.stage_durations
                        and not c.cached and (k != "text_encode" or c.index == 0)]) for k in STAGES}
    last = max((c.received_s for s in done for c in s.chunks), default=0.0)
    out = {
        "sessions": len(sessions), "completed": sum(1 for s in done if not s.error and not s.refused),
        "refused_busy": sum(s.refused for s in sessions), "busy_replies": sum(s.busy_replies for s in sessions),
        "errors": [s.error for s in sessions if s.error],
        "queued": sum(s.wait.notices > 0 for s in sessions),  # sessions that waited in the server's line
        "queued_max_s": max((s.wait.seconds for s in sessions), default=0.0),
        "cached_chunks": sum(c.cached for s in done for c in s.chunks),  # 0 unless inputs repeated a stored session's
        "ttfc_p50_s": _pct(ttfc_pool, 50), "ttfc_p95_s": _pct(ttfc_pool, 95),
        "interval_p50_s": _pct(intervals, 50), "interval_p95_s": _pct(intervals, 95),
        "interval_mean_s": _mean(intervals), "dit_step_mean_s": _mean(dit_steady),
        "serving_overhead_s": (_mean(intervals) - _mean(dit_steady)) if intervals and dit_steady else None,
        "interval_over_dit": (_mean(intervals) / _mean(dit_steady)) if intervals and _mean(dit_steady) else None,
        "aggregate_fps": sum(s.frames for s in done) / last if last > 0 else 0.0,
        "stage_means_s": stages, "wall_s": wall_s,
        "reset_max_s": max((s.reset_s for s in sessions if s.reset_s is not None), default=None),
        "per_session": [{"session_id": s.session_id, "ttfc_s": s.ttfc_s, "chunks": len(s.chunks), "frames": s.frames,
                         "interval_p50_s": _pct(s.intervals, 50), "interval_p95_s": _pct(s.intervals, 95),
                         "busy_replies": s.busy_replies, "refused": s.refused, "error": s.error,
                         "reset_s": s.reset_s, **s.wait.report()} for s in sessions],
    }
    if first_after_start and sessions and sessions[0].ttfc_s is not None:
        out["first_session_after_start_ttfc_s"] = sessions[0].ttfc_s
    return out


async def run_load(args: argparse.Namespace, n: int, run: int) -> tuple[list[SessionRecord], float]:
    t_run = time.perf_counter()
    sessions = await asyncio.gather(*(one_session(args, run, i, t_run) for i in range(n)))
    return list(sessions), time.perf_counter() - t_run


def fmt(v: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    head = (f"{'N':>3} {'ok':>3} {'busy':>4} {'TTFC p50':>9} {'TTFC p95':>9} {'int p50':>8} {'int p95':>8} "
            f"{'DiT step':>8} {'overhead':>8} {'int/DiT':>7} {'agg fps':>8}")
    lines = [head, "-" * len(head)]
    first = None
    for r in results["runs"]:
        s = r["summary"]
        first = s.get("first_session_after_start_ttfc_s", first)
        lines.append(f"{r['sessions']:>3} {s['completed']:>3} {s['refused_busy']:>4} {fmt(s['ttfc_p50_s']):>9} "
                     f"{fmt(s['ttfc_p95_s']):>9} {fmt(s['interval_p50_s']):>8} {fmt(s['interval_p95_s']):>8} "
                     f"{fmt(s['dit_step_mean_s']):>8} {fmt(s['serving_overhead_s'], digits=3):>8} "
                     f"{fmt(s['interval_over_dit'], digits=3):>7} {s['aggregate_fps']:>8.2f}")
    lines.append(f"first session after start: TTFC {fmt(first)} s (reported apart, not in the p50/p95)")
    for r in results["runs"]:
        if r["summary"].get("queued"):
            lines.append(f"N={r['sessions']}: {r['summary']['queued']} session(s) waited in the server's line, at "
                         f"most {fmt(r['summary']['queued_max_s'])} s (their TTFC includes the wait)")
    for r in results["runs"]:
        stages = ", ".join(f"{k} {fmt(v, 1000, 0)}" for k, v in r["summary"]["stage_means_s"].items() if v is not None)
        lines.append(f"N={r['sessions']} stages (mean ms): {stages}")
        for name, reps in r.get("replicas_after", {}).get("replicas", {}).items():
            mem = ", ".join(f"{fmt((x.get('peak_memory_bytes') or 0) / GIB)} GiB peak"
                            + (f" / cap {fmt(x['memory_cap_bytes'] / GIB)}" if x.get("memory_cap_bytes") else "")
                            for x in reps)
            lines.append(f"    {name}: {mem}")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Optional[str]:
    """Chunk intervals (lines) and TTFC (markers) of each session over time, one panel per run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (run `--plot-from JSON` where it is)"
    runs = results["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.8 * len(runs)), squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        for s in r["raw_sessions"]:
            times = [c["received_s"] for c in s["chunks"]]
            if not times:
                continue
            line, = ax.plot(times[1:], np.diff(times), marker=".", label=s["session_id"])
            ax.plot([times[0]], [s["ttfc_s"]], marker="*", markersize=11, color=line.get_color(), linestyle="none")
        ax.set_title(f"{r['sessions']} concurrent session(s): chunk intervals (lines), TTFC (stars)")
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
        if len(r["raw_sessions"]) <= 8:
            ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4], help="concurrent sessions, one run each")
    p.add_argument("--frames", type=int, default=81, help="video frames per session (12k - 3: 21, 33, ..., 81)")
    p.add_argument("--pipeline", type=int, default=2, help="chunks in flight per session")
    p.add_argument("--open-ended", action="store_true",
                   help="declare no num_frames: open-ended sessions (the server's rolling window, if configured)")
    p.add_argument("--size", default=None, help='the sessions\' `size` (default: the server\'s)')
    p.add_argument("--trajectory", default="dolly", choices=["orbit", "dolly", "pan"])
    p.add_argument("--busy-timeout-s", type=float, default=0.0,
                   help="how long a refused session retries `busy` (0: it gives up and counts as refused)")
    p.add_argument("--reply-timeout-s", type=float, default=600.0)
    p.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--api-key", default=None)
    p.add_argument("--out", default="serve_load.json")
    p.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    p.add_argument("--plot-from", default=None, help="only draw the plot of an existing JSON")
    drive_load.add_arguments(p)
    arrivals.add_arguments(p)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.plot_from:
        results = json.loads(Path(args.plot_from).read_text())
        note = plot(results, Path(args.plot or Path(args.plot_from).with_suffix(".png")))
        print(note or "plot written")
        return results
    if args.drive:  # a driven session's control lag (benchmarks/drive_load.py)
        return drive_load.main(args, http_base(args.url), replica_report)
    if args.arrival_rate is not None:  # sessions arriving at random (benchmarks/line/arrivals.py)
        args.tag = invocation_tag()
        return arrivals.main(args, http_base(args.url), get_json, model_card)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    base = http_base(args.url)
    args.tag = invocation_tag()
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("api_key", "plot_from")},
        "server_before": replica_report(base, args.api_key), "runs": [],
    }
    for run, n in enumerate(args.sessions):
        elapsed = time.perf_counter() - t0
        if args.deadline_s is not None and elapsed > args.deadline_s:
            results["runs"].append({"sessions": n, "skipped": f"deadline: {elapsed:.0f} s elapsed"})
            continue
        print(f"[{elapsed:6.1f}s] run {run}: {n} concurrent session(s) of {args.frames} frames", flush=True)
        sessions, wall = asyncio.run(run_load(args, n, run))
        results["runs"].append({
            "sessions": n, "summary": summarise(sessions, wall, first_after_start=run == 0),
            "raw_sessions": [asdict(s) for s in sessions],
            "replicas_after": replica_report(base, args.api_key),
        })
        out.write_text(json.dumps(results, indent=1))
    results["runs"] = [r for r in results["runs"] if "summary" in r] + [r for r in results["runs"] if "skipped" in r]
    results["wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(results, indent=1))
    done = {"runs": [r for r in results["runs"] if "summary" in r]}
    text = table(done) if done["runs"] else "no run completed"
    cached = sum(r["summary"]["cached_chunks"] for r in done["runs"])
    if cached:
        text += (f"\n{cached} chunks came from the server's prefix store (a stored session's inputs again): "
                 "their times are not the model's")
    print(text)
    out.with_suffix(".txt").write_text(text + "\n")
    if done["runs"]:
        note = plot(done, Path(args.plot) if args.plot else out.with_suffix(".png"))
        if note:
            print(note, file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
