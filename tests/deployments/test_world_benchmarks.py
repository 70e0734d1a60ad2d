"""gpu_serve.sh's world and sharing hooks (issues 55 and 56) run here against the tiny model, as
test_one_seat_benchmarks.py runs the others: WORLD_OPEN=1 (benchmarks/worlds/open_replay.py:
save worlds, open them, a replay from the inputs), RESTART_DRILL=1 (benchmarks/worlds/restart_drill.py:
two live sessions, the app deleted and run again as `serve shutdown` + `serve run`, both resumed
with their tokens) and WATCH_LOAD=1 (benchmarks/sharing/watch_load.py: an owner and N viewers
over two ingress replicas). One app: the world store in a folder, sessions parked for a resume,
two ingress replicas, one DiT replica."""
from __future__ import annotations

import json

import pytest
from ray import serve

from benchmarks.sharing.watch_load import main as watch_main
from benchmarks.worlds.open_replay import main as open_main
from benchmarks.worlds.restart_drill import main as drill_main

APP = "worldbench"


@pytest.fixture(scope="module")
def app_args(tmp_path_factory) -> dict:
    return {"worlds": {"enabled": True, "root": str(tmp_path_factory.mktemp("worlds"))},
            "sessions": {"max_sessions": 4, "resume": {"grace_s": 30.0}},
            "dit": {"num_replicas": 1}, "ingress": {"num_replicas": 2}}


@pytest.fixture(scope="module")
def world_app(extra_app, app_args):
    app, _ = extra_app(APP, **app_args)
    yield app
    serve.delete(APP)


def test_world_open_saves_opens_and_replays_byte_identical(world_app, tmp_path):
    out = tmp_path / "world_open.json"
    r = open_main(["--url", world_app.ws, "--open", "2,3", "--timeout-s", "120", "--out", str(out)])
    assert json.loads(out.read_text()) == r
    assert r["chunks_built"] == 4 and set(r["opened"]) == {"2", "3"}
    for n, o in r["opened"].items():  # the first new chunk after the open is the build session's chunk n
        assert o["identical"] is True and 0 < o["opened_s"] <= o["open_to_first_new_chunk_s"], (n, o)
    assert r["replay"]["identical_chunks"] == 4 and r["all_identical"] is True  # the replay made the same bytes
    assert 0 < r["replay"]["to_chunk_s"]["2"] < r["replay"]["to_chunk_s"]["3"]
    assert set(r["open_vs_replay"]) == {"2", "3"}


def test_restart_drill_both_sessions_resume_byte_identical(world_app, extra_app, app_args, tmp_path):
    state, out = tmp_path / "state.json", tmp_path / "restart_drill.json"
    started = drill_main(["--phase", "start", "--url", world_app.ws, "--state", str(state), "--sessions", "2",
                          "--chunks", "3", "--before", "1", "--settle-s", "0.5", "--timeout-s", "120"])
    assert set(started["sessions"]) == {"restart-0", "restart-1"}
    assert all(len(s["reference"]) == 3 and len(s["chunks"]) == 1 and s["token"] for s in started["sessions"].values())
    # the two references differ (seeds and trajectories): a drill that compared the wrong session would fail
    assert started["sessions"]["restart-0"]["reference"] != started["sessions"]["restart-1"]["reference"]

    serve.delete(APP)  # serve shutdown ... serve run: a new app, its parking knows no session
    app, _ = extra_app(APP, **app_args)
    r = drill_main(["--phase", "resume", "--url", app.ws, "--state", str(state), "--healthy-s", "1.5",
                    "--stopped-at", "0", "--timeout-s", "120", "--out", str(out)])
    assert json.loads(out.read_text()) == r
    assert r["identical_chunks"] == r["of_chunks"] == 6 and r["all_identical"] is True, r
    assert r["resumed_at_chunk"] == 1 and r["time_to_healthy_s"] == 1.5 and r["stop_to_all_resumed_s"] > 0
    assert all(s["first_frame_after_connect_s"] > 0 for s in r["sessions"].values())


def test_restart_drill_counts_a_session_that_did_not_continue_identically(world_app, tmp_path):
    """The drill's comparison can fail: a state whose reference was tampered with counts a chunk less."""
    state = tmp_path / "state.json"
    drill_main(["--phase", "start", "--url", world_app.ws, "--state", str(state), "--sessions", "1",
                "--chunks", "2", "--before", "1", "--settle-s", "0.5", "--timeout-s", "120"])
    s = json.loads(state.read_text())
    s["sessions"]["restart-0"]["reference"][1] = "0" * 64
    state.write_text(json.dumps(s))
    r = drill_main(["--phase", "resume", "--url", world_app.ws, "--state", str(state), "--timeout-s", "120",
                    "--out", str(tmp_path / "r.json")])
    assert r["identical_chunks"] == 1 and r["of_chunks"] == 2 and r["all_identical"] is False


def test_watch_load_every_viewer_gets_every_chunk_and_memory_is_measured(world_app, tmp_path):
    out = tmp_path / "watch_load.json"
    r = watch_main(["--url", world_app.ws, "--viewers", "1", "3", "--chunks", "3", "--app", APP,
                    "--timeout-s", "120", "--out", str(out)])
    assert json.loads(out.read_text()) == r
    assert [run["viewers"] for run in r["runs"]] == [0, 1, 3, 0] and r["baseline_interval_s"] > 0
    for run in r["runs"]:
        assert run["chunks_skipped"] == 0 and len(run["owner_intervals_s"]) == 2 and run["interval_ratio"] > 0
        if run["viewers"]:
            assert run["lag_s"]["samples"] == 3 * run["viewers"], run  # chunks 1..3, each viewer
            assert run["lag_s"]["first_viewer_p50"] <= run["lag_s"]["p50"] <= run["lag_s"]["p95"]
            assert sum(run["viewers_per_ingress_replica"].values()) == run["viewers"]
            assert run["ingress_rss_mib"]["replicas"] == 2 and run["ingress_rss_mib"]["before"] > 0  # both, this app's
            assert "per_viewer_kib" in run["ingress_rss_mib"]
