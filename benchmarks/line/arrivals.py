"""serve_load's arrival-rate mode: sessions arriving as a Poisson process (issue 46).

    python -m benchmarks.serve_load --arrival-rate 6 --duration-s 600 --frames 81 --out arrivals.json

Sessions arrive at `--arrival-rate` a minute (exponential gaps, `--seed`) for `--duration-s`;
each one streams a synthetic session of `--frames` frames (or, with --frames-choices, a
length drawn from them) and resets it. A session the server cannot start waits in its line
(`queued` notices) or, on a server without one, retries `busy` (--busy-timeout-s). The server's
line length is sampled from /healthz every second.

Reported (seconds, the client's clock):
* wait: arrival to the first frame minus the server's time to first chunk of a session that did
  not wait (the median TTFC of the sessions that got no `queued` notice); 0 when it never waited.
* ETA error: for each session that waited, |first notice's eta_s - its wait after that notice|
  / that wait (the issue's ±30 %).
* frames/s per live session: frames after the first chunk / time from its first chunk to its last.
* the line's length over time (/healthz `line.waiting`), and the bound `max_waiting x longest
  session` every wait must stay under (no starvation).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from benchmarks.served import stream_synthetic
from client.errors import ServerError
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session
from protocol.errors import ErrorCode
from protocol.messages import Queued

SAMPLE_PERIOD_S = 1.0


@dataclass
class Arrival:
    index: int
    arrived_s: float  # since the run started
    frames: int
    notices: list[tuple[float, int, Optional[float]]] = field(default_factory=list)  # (at_s, position, eta_s)
    first_frame_s: Optional[float] = None
    last_frame_s: Optional[float] = None
    chunks: int = 0
    video_frames: int = 0
    busy_replies: int = 0
    error: Optional[str] = None
    ended_s: Optional[float] = None

    @property
    def fps(self) -> Optional[float]:
        if self.chunks < 2 or self.last_frame_s is None or self.first_frame_s is None:
            return None
        span = self.last_frame_s - self.first_frame_s
        return (self.video_frames - 9) / span if span > 0 else None


async def one_arrival(args: argparse.Namespace, rec: Arrival, t0: float) -> None:
    sid = f"arrival-{args.tag}-{rec.index}"
    traj = synthetic_trajectory(args.trajectory, rec.frames,
                                prompt=f"{DEFAULT_PROMPT} (arrival {args.tag}.{rec.index})")
    plan = plan_session(traj, rec.frames)
    messages = traj.messages(plan, sid, size=args.size, open_ended=args.open_ended)

    def now() -> float:
        return time.perf_counter() - t0

    def on_queued(q: Queued) -> None:
        rec.notices.append((now(), q.position, q.eta_s))

    def on_chunk(stat, reply) -> None:
        t = now()
        rec.first_frame_s = rec.first_frame_s if rec.first_frame_s is not None else t
        rec.last_frame_s = t
        rec.chunks += 1
        rec.video_frames += reply.num_frames

    def on_busy(err: ServerError) -> None:
        rec.busy_replies += 1

    out = await stream_synthetic(args.url, args.api_key, sid, messages, on_queued, pipeline=args.pipeline,
                                 on_chunk=on_chunk, on_busy=on_busy, busy_timeout_s=args.busy_timeout_s,
                                 reply_timeout_s=args.reply_timeout_s)
    e = out.error
    if not out.connected:
        rec.error = f"connect: {type(e).__name__}: {e}"
        return
    rec.ended_s = now()
    if isinstance(e, ServerError):
        rec.error = f"{e.code.value}: {e.message}"
        rec.busy_replies += e.code is ErrorCode.BUSY
    elif e is not None:
        rec.error = f"{type(e).__name__}: {e}"


async def sample_line(base: str, api_key: Optional[str], t0: float, until: Callable[[], bool],
                      get_json) -> list[tuple[float, Optional[int]]]:
    """(seconds since start, sessions waiting) every SAMPLE_PERIOD_S from /healthz."""
    samples: list[tuple[float, Optional[int]]] = []
    while not until():
        try:
            health = await asyncio.to_thread(get_json, f"{base}/healthz", api_key, 5.0)
            line = health.get("line") or {}
            samples.append((time.perf_counter() - t0, line.get("waiting")))
        except Exception:  # noqa: BLE001 - a missed sample
            samples.append((time.perf_counter() - t0, None))
        await asyncio.sleep(SAMPLE_PERIOD_S)
    return samples


def arrival_times(rate_per_min: float, duration_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_min / 60.0)
        if t >= duration_s:
            return times
        times.append(t)


async def run(args: argparse.Namespace, base: str, get_json) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    lengths = args.frames_choices or [args.frames]
    t0 = time.perf_counter()
    records = [Arrival(i, at, rng.choice(lengths)) for i, at in enumerate(arrival_times(
        args.arrival_rate, args.duration_s, args.seed))]
    done = {"all": False}
    sampler = asyncio.ensure_future(sample_line(base, args.api_key, t0, lambda: done["all"], get_json))

    async def start(rec: Arrival) -> None:
        await asyncio.sleep(max(0.0, rec.arrived_s - (time.perf_counter() - t0)))
        await one_arrival(args, rec, t0)

    await asyncio.gather(*(start(r) for r in records))
    done["all"] = True
    samples = await sampler
    return {"arrivals": [asdict(r) | {"fps": r.fps} for r in records], "line_samples": samples,
            "wall_s": time.perf_counter() - t0}


def _pct(values: list[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q)) if values else None


def summarise(result: dict[str, Any], max_waiting: Optional[int]) -> dict[str, Any]:
    recs = [a for a in result["arrivals"] if a["first_frame_s"] is not None]
    unqueued = [a["first_frame_s"] - a["arrived_s"] for a in recs if not a["notices"]]
    base_ttfc = float(np.median(unqueued)) if unqueued else 0.0
    waits, eta_errors = [], []
    for a in recs:
        wait = max(0.0, a["first_frame_s"] - a["arrived_s"] - base_ttfc) if a["notices"] else 0.0
        waits.append(wait)
        if a["notices"]:
            at, _, eta = a["notices"][0]
            actual = a["first_frame_s"] - base_ttfc - at
            if eta is not None and actual > 1.0:
                eta_errors.append(abs(eta - actual) / actual)
    lengths = [a["last_frame_s"] - a["first_frame_s"] for a in recs if a["last_frame_s"] is not None]
    longest = max(lengths, default=0.0)
    bound = None if max_waiting is None else max_waiting * longest
    fps = [a["fps"] for a in recs if a["fps"] is not None]
    line = [n for _, n in result["line_samples"] if n is not None]
    return {
        "arrivals": len(result["arrivals"]), "started": len(recs), "queued": sum(1 for a in recs if a["notices"]),
        "errors": [a["error"] for a in result["arrivals"] if a["error"]],
        "busy_replies": sum(a["busy_replies"] for a in result["arrivals"]),
        "ttfc_unqueued_median_s": base_ttfc,
        "wait_p50_s": _pct(waits, 50), "wait_p95_s": _pct(waits, 95), "wait_max_s": max(waits, default=None),
        "eta_error_p50": _pct(eta_errors, 50), "eta_error_max": max(eta_errors, default=None),
        "eta_within_30pct": sum(e <= 0.3 for e in eta_errors), "eta_judged": len(eta_errors),
        "fps_per_session_p50": _pct(fps, 50), "fps_per_session_min": min(fps, default=None),
        "line_max": max(line, default=None), "line_mean": float(np.mean(line)) if line else None,
        "longest_session_s": longest, "starvation_bound_s": bound,
        "every_wait_under_bound": None if bound is None else all(w < bound for w in waits),
    }


def plot(result: dict[str, Any], path: Path) -> Optional[str]:
    """The line's length over time (top) and each session's wait and play spans (bottom)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    samples = [(t, n) for t, n in result["line_samples"] if n is not None]
    if samples:
        top.step([t for t, _ in samples], [n for _, n in samples], where="post")
    top.set_ylabel("sessions waiting")
    top.grid(alpha=0.3)
    for a in result["arrivals"]:
        y = a["index"]
        if a["first_frame_s"] is not None:
            bottom.plot([a["arrived_s"], a["first_frame_s"]], [y, y], color="tab:orange", linewidth=2)
            bottom.plot([a["first_frame_s"], a["last_frame_s"]], [y, y], color="tab:blue", linewidth=2)
        else:
            bottom.plot([a["arrived_s"]], [y], marker="x", color="tab:red")
    bottom.set_xlabel("seconds since the first arrival")
    bottom.set_ylabel("session (orange: waiting, blue: playing)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--arrival-rate: sessions arriving at random (benchmarks/line/arrivals.py)")
    g.add_argument("--arrival-rate", type=float, default=None, help="sessions a minute (Poisson arrivals)")
    g.add_argument("--duration-s", type=float, default=600.0, help="how long sessions keep arriving")
    g.add_argument("--frames-choices", type=int, nargs="+", default=None,
                   help="session lengths drawn at random (default: --frames for every session)")
    g.add_argument("--arrival-seed", type=int, default=0, help="the arrivals' seed")


def main(args: argparse.Namespace, base: str, get_json, model_card) -> dict[str, Any]:
    args.seed = args.arrival_seed
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    card = model_card(base, args.api_key)
    line = (card.get("sessions") or {}).get("line") or {}
    result = asyncio.run(run(args, base, get_json))
    summary = summarise(result, line.get("max_waiting"))
    report = {"config": {k: v for k, v in vars(args).items() if k not in ("api_key", "plot_from")},
              "server": {"sessions": card.get("sessions")}, "summary": summary, **result}
    out.write_text(json.dumps(report, indent=1))
    text = "\n".join(f"{k}: {v}" for k, v in summary.items())
    print(text)
    out.with_suffix(".txt").write_text(text + "\n")
    note = plot(result, Path(args.plot) if args.plot else out.with_suffix(".png"))
    if note:
        print(note)
    return report
