"""gpu_serve.sh's hooks against a one-seat app (issue 54, item 8): `BRANCH=1 RESUME_DRILL=1
RECOVERY_DRILL=1` on serve_config.gpu.yaml (`sessions.max_sessions: 1`, a waiting line, sessions
resumable) failed on an H100: branch_bench died on `busy` for its fork and left its session
parked, and resume_drill's reference session, `queued` behind it, died on the notice. Here the
same hooks run in the same order against the tiny model with one seat: branch_bench skips what
needs two seats (saying so) and leaves nothing parked; the resume drill's reference session
waits in line behind a session that holds the seat and records the wait; the recovery drill
kills the only DiT replica and plays on."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ray import serve

from benchmarks.branch_bench import main as branch_main
from benchmarks.resume_drill import main as drill_main
from client.session import WorldClient
from client.synthetic import synthetic_trajectory
from client.trajectory import plan_session
from protocol.messages import FrameReply
from support import REPO

APP = "oneseat"
GRACE_S = 30.0  # a session left parked holds the seat this long: longer than the checks below wait
RELEASED_WITHIN_S = 10.0
IDLE_TTL_S = 300.0  # serve_config.gpu.yaml's: a holder keeps its seat while the others wait


@pytest.fixture(scope="module")
def one_seat(extra_app):
    """One DiT slot, a line, sessions resumable for GRACE_S, the prefix store and snapshots on:
    serve_config.gpu.yaml's shape on the tiny model. The idle TTL is long (the test apps' 10 s
    expired an idle holder before its waiter came, on a loaded machine)."""
    app, _ = extra_app(APP, sessions={"max_sessions": 1, "max_waiting": 4, "resume": {"grace_s": GRACE_S},
                                      "idle_ttl_s": IDLE_TTL_S},
                       dit={"num_replicas": 1, "num_cpus": 0.1}, prefix_cache={"max_mib": 1, "snapshot_mib": 16})
    yield app
    serve.delete(APP)


def _waiting(app) -> int:
    return httpx.get(f"{app.http}/healthz", timeout=10).json()["line"]["waiting"]


def _hold_until_one_waits(app, holding: threading.Event) -> None:
    """A session takes the one seat (its chunk 0; never from the prefix store, which would hold no
    seat for it), keeps it until another session waits in the line and has had its notices for a
    moment, then resets."""

    async def go() -> None:
        traj = synthetic_trajectory("orbit", 33, prompt="the seat holder")
        first = traj.messages(plan_session(traj, 33), "holder", prefix_cache=False)[0]  # computed: a seat
        async with await WorldClient.connect(app.ws) as c:
            await c.send(first)
            assert isinstance(await c.receive(120), FrameReply)
            holding.set()
            deadline = time.monotonic() + 120
            while await asyncio.to_thread(_waiting, app) < 1:
                assert time.monotonic() < deadline, "no session came to wait for the seat"
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)
            await c.reset("holder")

    asyncio.run(go())


def test_the_gpu_serve_hooks_complete_on_one_seat_and_record_their_waits(one_seat, tmp_path):
    app = one_seat
    app.wait_held(0)

    # BRANCH=1: what needs two seats is skipped and says so; nothing is left parked
    branch = tmp_path / "branch.json"
    assert branch_main(["--url", app.ws, "--chunks", "3", "--reply-timeout-s", "120", "--out", str(branch)]) == 0
    r = json.loads(branch.read_text())
    assert r["seats"] == 1
    skipped = "needs 2 sessions at once; the server has 1 seat"
    assert r["fork"]["skipped"].startswith(skipped) and r["fork_below"]["skipped"].startswith(skipped)
    assert r["hit"]["after_cold_reset"] is True and r["hit"]["cached"] == 3 and r["hit"]["video_equal"] == 3
    assert r["rewind"]["video_equal"] is True and r["leave"]["cached"] == 1
    assert set(r["line"]) == {"a", "b", "d"} and all(w["queued_s"] >= 0 for w in r["line"].values())
    app.wait_held(0, timeout=RELEASED_WITHIN_S)  # every session reset, none parked for GRACE_S

    # RESUME_DRILL=1: its reference session finds the seat taken, waits in line, records the wait
    holding = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_hold_until_one_waits, app, holding)
        assert holding.wait(120), holder.exception(0) if holder.done() else "the holder got no seat"
        drill = drill_main(["--url", app.ws, "--frames", "33", "--drop-after", "0", "--timeout-s", "120",
                            "--out", str(tmp_path / "resume_drill.json")])
        holder.result()
    waited = drill["store_off"]["line"]["reference"]
    assert waited["notices"] >= 1 and waited["first_position"] == 1 and waited["queued_s"] > 1.0, waited
    assert drill["queued_s"] >= waited["queued_s"] and drill["all_identical"], drill
    for run in (drill["store_off"], drill["store_on"]):
        assert run["chunks"] == 3 and run["replayed"] == run["in_flight_at_drop"] == 1 and run["all_identical"]
    assert json.loads((tmp_path / "resume_drill.json").read_text())["queued_s"] == drill["queued_s"]
    app.wait_held(0, timeout=RELEASED_WITHIN_S)

    # RECOVERY_DRILL=1: the only DiT replica killed mid-session; the session is rebuilt and plays on
    recovery = drill_main(["--url", app.ws, "--frames", "33", "--drop-after", "0", "--timeout-s", "120", "--stores",
                           "--kill-app", APP, "--out", str(tmp_path / "recovery_drill.json")])
    kill = recovery["kill"]
    assert kill["recoveries"] == 1 and kill["all_identical"] and kill["identical_chunks"] == 3, kill
    assert set(kill["line"]) == {"reference", "session"}
    assert recovery["queued_s"] == kill["queued_s"] >= 0


def test_serve_load_sessions_beyond_the_seats_wait_in_line_and_say_so(one_seat, tmp_path):
    """Two sessions at once on one seat: the second waits in the line and starts when the first
    ends; both complete, none is `busy`, and the summary, each session and the table say who
    waited and how long (its TTFC includes the wait)."""
    from benchmarks.serve_load import main as load_main

    one_seat.wait_held(0)
    out = tmp_path / "load.json"
    load_main(["--url", one_seat.ws, "--sessions", "2", "--frames", "21", "--reply-timeout-s", "120",
               "--out", str(out)])
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["completed"] == 2 and s["refused_busy"] == 0 and not s["errors"], s
    assert s["queued"] == 1 and s["queued_max_s"] > 0
    waited = [p for p in s["per_session"] if p["notices"]]
    assert len(waited) == 1 and waited[0]["first_position"] == 1 and waited[0]["queued_s"] == round(s["queued_max_s"], 3)
    assert "1 session(s) waited in the server's line" in out.with_suffix(".txt").read_text()
    one_seat.wait_held(0, timeout=RELEASED_WITHIN_S)


def test_a_driven_session_waits_for_the_seat_and_records_the_wait(one_seat, tmp_path):
    """`serve_load --drive` (benchmarks/drive_load.py) while another session holds the one seat:
    its `drive` waits in the line, then it is measured as usual; the summary has its wait."""
    from benchmarks.serve_load import main as load_main

    one_seat.wait_held(0)
    holding = threading.Event()
    out = tmp_path / "drive.json"
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_hold_until_one_waits, one_seat, holding)
        assert holding.wait(120), holder.exception(0) if holder.done() else "the holder got no seat"
        load_main(["--drive", "--url", one_seat.ws, "--presses", "1", "--hold-chunks", "1", "--pause-s", "0.5",
                   "--reply-timeout-s", "120", "--out", str(out)])
        holder.result()
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert not s["errors"] and s["presses"] == 1, s
    assert s["notices"] >= 1 and s["first_position"] == 1 and s["queued_s"] > 1.0, s
    one_seat.wait_held(0, timeout=RELEASED_WITHIN_S)


def test_a_hook_ended_by_its_timeout_leaves_no_session_parked(one_seat, tmp_path):
    """gpu_serve.sh ends a hook that runs out of budget with `timeout` (SIGTERM): branch_bench
    resets its session before it exits, so the seat is free at once, not after the resume
    grace (GRACE_S) a socket closed without a reset is parked for."""
    one_seat.wait_held(0)
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.branch_bench", "--url", one_seat.ws, "--chunks", "40",
                             "--out", str(tmp_path / "cut.json")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        one_seat.wait_held(1, timeout=120)  # its session A streams
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    one_seat.wait_held(0, timeout=RELEASED_WITHIN_S)
    assert proc.returncode != 0 and b"CancelledError" in err, err[-2000:]  # it was cut, not finished


def test_the_autoscale_benchmark_waits_in_line_for_the_new_replica(extra_app, tmp_path):
    """benchmarks/autoscale_ready.py against an autoscaled app with a line (one slot per DiT
    replica, 1..2 replicas): B is `queued`, not `busy`, while A holds the slot; the policy starts
    a second replica and B, still in line, starts there; its wait is recorded."""
    from benchmarks.autoscale_ready import main as bench_main

    app, _ = extra_app("autoline", sessions={"max_sessions": 1, "max_waiting": 4, "retry_after_s": 0.5},
                       dit={"num_cpus": 0.1, "graceful_shutdown_timeout_s": 5,
                            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 0,
                                            "downscale_delay_s": 2, "look_back_period_s": 1,
                                            "metrics_interval_s": 0.5}})
    try:
        out = tmp_path / "autoscale.json"
        assert bench_main(["--url", app.ws, "--retry-s", "0.25", "--out", str(out)]) == 0
        r = json.loads(out.read_text())
        assert r["new_replica"]["replica"] != r["first_replica"]["replica"]
        assert r["tries"] == 1 and r["line"]["notices"] >= 1 and r["line"]["first_position"] == 1, r
        assert 0 < r["busy_to_constructor_s"] < r["busy_to_ready_s"] <= r["busy_to_first_frame_s"]
    finally:
        serve.delete("autoline")
