"""Issue 46's three served scenarios, one after the other, against a running server:

    python -m benchmarks.line.scenarios --url ws://HOST:8000/v1/realtime/world/camera --out line_bench.json

* `line`: two sessions take the places (with `sessions.min_fps` set so that two fit), a third
  and a fourth arrive while they play: they must wait with positions 1 and 2, each first
  notice's ETA within ±30 % of the wait that followed it, start as a session ends, and no
  client may get `busy`. The wait after a notice: its first frame minus the notice, minus the
  time to first chunk of a session that did not wait (a solo session measured first).
* `jobs`: one live session alone, then the same session while three `/v1/videos` jobs run (sent
  first, async): its mean chunk interval over the one alone (≤ 1.15), and the jobs finish.
* `fair`: two live sessions at once, pipeline 2 and pipeline 1: each one's mean chunk interval
  (within 10 % of the other's).

Sessions are synthetic (client/synthetic.py), `--frames` long with num_frames declared, a distinct
prompt each (the text cache and a prefix store hide nothing).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.serve_load import http_base
from benchmarks.served import stream_synthetic
from client.errors import ServerError
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import plan_session

JOB_POLL_S = 1.0


@dataclass
class Run:
    name: str
    started_s: float
    notices: list[tuple[float, int, Optional[float]]] = field(default_factory=list)
    frames_at: list[float] = field(default_factory=list)
    busy: int = 0
    error: Optional[str] = None

    @property
    def intervals(self) -> list[float]:
        return list(np.diff(self.frames_at)) if len(self.frames_at) > 1 else []


async def session(url: str, name: str, frames: int, pipeline: int, t0: float, tag: str) -> Run:
    run = Run(name, time.perf_counter() - t0)
    traj = synthetic_trajectory("dolly", frames, prompt=f"{DEFAULT_PROMPT} (line bench {tag}.{name})")
    sid = f"line-{tag}-{name}"
    messages = traj.messages(plan_session(traj, frames), sid)

    def on_busy(err: ServerError) -> None:
        run.busy += 1

    out = await stream_synthetic(url, None, sid, messages,
                                 lambda q: run.notices.append((time.perf_counter() - t0, q.position, q.eta_s)),
                                 pipeline=pipeline, busy_timeout_s=0.0, reply_timeout_s=300, on_busy=on_busy,
                                 on_chunk=lambda stat, reply: run.frames_at.append(time.perf_counter() - t0))
    if not out.connected:
        raise out.error
    if out.error is not None:
        run.error = f"{type(out.error).__name__}: {out.error}"
    return run


async def line(args: argparse.Namespace, tag: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    solo = await session(args.url, "solo", 21, 2, t0, tag)
    ttfc_solo = solo.frames_at[0] - solo.started_s if solo.frames_at else 0.0
    t0 = time.perf_counter()
    holders = [asyncio.ensure_future(session(args.url, f"s{i}", args.frames, 2, t0, tag)) for i in range(2)]
    await asyncio.sleep(args.arrive_after_s)
    third = asyncio.ensure_future(session(args.url, "s2", args.frames, 2, t0, tag))
    await asyncio.sleep(0.5)
    fourth = asyncio.ensure_future(session(args.url, "s3", args.frames, 2, t0, tag))
    runs = await asyncio.gather(*holders, third, fourth)
    judged = []
    for r in runs[2:]:
        if not r.notices or not r.frames_at:
            judged.append({"name": r.name, "waited": bool(r.notices), "started": bool(r.frames_at),
                           "first_position": r.notices[0][1] if r.notices else None})
            continue
        at, position, eta = r.notices[0]
        actual = r.frames_at[0] - ttfc_solo - at
        judged.append({"name": r.name, "waited": True, "first_position": position, "eta_s": eta,
                       "actual_wait_s": actual, "eta_error": None if eta is None or actual <= 0 else
                       abs(eta - actual) / actual})
    ends = sorted(r.frames_at[-1] for r in runs[:2] if r.frames_at)
    return {"ttfc_solo_s": ttfc_solo, "runs": [asdict(r) for r in runs], "waiters": judged,
            "holders_ended_s": ends,
            "positions_1_and_2": [j.get("first_position") for j in judged] == [1, 2],
            "etas_within_30pct": all(j.get("eta_error") is not None and j["eta_error"] <= 0.3 for j in judged),
            "busy_replies": sum(r.busy for r in runs), "errors": [r.error for r in runs if r.error]}


def _post_job(base: str, frames: int, tag: str, i: int) -> dict[str, Any]:
    traj = synthetic_trajectory("orbit", frames, prompt=f"{DEFAULT_PROMPT} (line bench job {tag}.{i})")
    body = {"image": base64.b64encode(traj.image).decode(), "prompt": traj.prompt, "num_frames": frames,
            "poses": traj.poses[:frames].tolist(), "intrinsics": traj.intrinsics[:frames].tolist()}
    req = urllib.request.Request(f"{base}/v1/videos?async=true", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _job(base: str, job: dict[str, Any]) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}{job['status_url']}", timeout=30) as r:
        return json.loads(r.read())


async def jobs(args: argparse.Namespace, tag: str) -> dict[str, Any]:
    base = http_base(args.url)
    t0 = time.perf_counter()
    alone = await session(args.url, "alone", args.frames, 2, t0, tag)
    posted = [await asyncio.to_thread(_post_job, base, args.job_frames, tag, i) for i in range(3)]
    t_jobs = time.perf_counter()
    await asyncio.sleep(args.jobs_head_start_s)  # a job's first chunk under way: the live session meets them
    with_jobs = await session(args.url, "with_jobs", args.frames, 2, t0, tag)
    finished: dict[str, float] = {}
    states: dict[str, str] = {}
    while len(finished) < len(posted) and time.perf_counter() - t_jobs < args.jobs_timeout_s:
        for j in posted:
            if j["id"] in finished:
                continue
            view = await asyncio.to_thread(_job, base, j)
            states[j["id"]] = view["status"]
            if view["status"] in ("succeeded", "failed"):
                finished[j["id"]] = time.perf_counter() - t_jobs
        await asyncio.sleep(JOB_POLL_S)
    mean_alone = float(np.mean(alone.intervals)) if alone.intervals else None
    mean_jobs = float(np.mean(with_jobs.intervals)) if with_jobs.intervals else None
    return {"alone": asdict(alone), "with_jobs": asdict(with_jobs), "interval_alone_s": mean_alone,
            "live_ended_s": with_jobs.frames_at[-1] if with_jobs.frames_at else None, "jobs_posted_s": t_jobs - t0,
            "interval_with_jobs_s": mean_jobs,
            "ratio": mean_jobs / mean_alone if mean_alone and mean_jobs else None,
            "jobs": {"states": states, "finished_after_s": finished,
                     "all_succeeded": len(finished) == len(posted) and all(v == "succeeded" for v in states.values())}}


async def fair(args: argparse.Namespace, tag: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    a, b = await asyncio.gather(session(args.url, "pipeline2", args.frames, 2, t0, tag),
                                session(args.url, "pipeline1", args.frames, 1, t0, tag))
    ma = float(np.mean(a.intervals)) if a.intervals else None
    mb = float(np.mean(b.intervals)) if b.intervals else None
    return {"pipeline2": asdict(a), "pipeline1": asdict(b), "interval_pipeline2_s": ma, "interval_pipeline1_s": mb,
            "difference": abs(ma - mb) / min(ma, mb) if ma and mb else None}


SCENARIOS = {"line": line, "jobs": jobs, "fair": fair}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/world/camera")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--job-frames", type=int, default=81)
    p.add_argument("--arrive-after-s", type=float, default=4.0, help="the third client arrives this long after the first two")
    p.add_argument("--jobs-timeout-s", type=float, default=300.0)
    p.add_argument("--jobs-head-start-s", type=float, default=2.0, help="the live session starts this long after the jobs")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--out", default="line_bench.json")
    args = p.parse_args(argv)
    tag = uuid.uuid4().hex[:6]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"config": vars(args)}
    for name in args.scenarios:
        t = time.perf_counter()
        results[name] = asyncio.run(SCENARIOS[name](args, tag))
        results[name]["wall_s"] = time.perf_counter() - t
        out.write_text(json.dumps(results, indent=1))
        summary = {k: v for k, v in results[name].items() if not isinstance(v, (dict, list)) or k in (
            "waiters", "errors")}
        print(name, json.dumps(summary, default=str), flush=True)
    return results


if __name__ == "__main__":
    main()
