"""benchmarks.serve_load against the CPU test app: 2 concurrent sessions of 2 chunks each."""
from __future__ import annotations

import json

from benchmarks.serve_load import main


def test_serve_load_writes_json_table_and_plot(server, tmp_path):
    server.wait_held(0)
    out = tmp_path / "load.json"
    main(["--url", server.ws, "--sessions", "2", "--frames", "21", "--out", str(out)])
    results = json.loads(out.read_text())
    (run,) = results["runs"]
    s = run["summary"]
    assert run["sessions"] == 2 and s["completed"] == 2 and s["refused_busy"] == 0 and not s["errors"]
    assert [p["chunks"] for p in s["per_session"]] == [2, 2]
    assert s["first_session_after_start_ttfc_s"] > 0 and s["ttfc_p50_s"] > 0  # the second session's
    assert s["interval_p50_s"] > 0 and s["dit_step_mean_s"] > 0 and s["aggregate_fps"] > 0
    assert s["serving_overhead_s"] is not None
    assert set(s["stage_means_s"]) >= {"dit", "vae_encode", "vae_decode", "mux", "total"}
    replicas = run["replicas_after"]["replicas"]
    assert set(replicas) == {"text_encoder", "vae", "dit"}
    assert all(r["peak_memory_bytes"] > 0 for r in replicas["dit"])
    assert replicas["dit"][0]["warmed_sizes"] == [[32, 48]]
    assert "TTFC p50" in out.with_suffix(".txt").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000
    assert all(0 < p["reset_s"] < 30 for p in s["per_session"]) and s["reset_max_s"] >= s["per_session"][0]["reset_s"]
    server.wait_held(0)


def test_serve_load_open_ended_sessions_declare_no_length(server, tmp_path):
    """--open-ended: the sessions declare no num_frames (test_codec checks the messages) and
    complete through the server; the run's config records it."""
    server.wait_held(0)
    out = tmp_path / "open.json"
    main(["--url", server.ws, "--sessions", "1", "--frames", "21", "--open-ended", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["config"]["open_ended"] is True
    (run,) = results["runs"]
    assert run["summary"]["completed"] == 1 and run["summary"]["per_session"][0]["chunks"] == 2
    server.wait_held(0)


def test_serve_load_measures_the_model_not_the_prefix_store(prefix_server, tmp_path, monkeypatch):
    """Against a server with the prefix store on, a second invocation's sessions are not served
    from the first's chunks (each invocation tags its prompts); repeated inputs would be, and the
    summary counts them (`cached_chunks`) and the table says so."""
    from benchmarks import serve_load

    prefix_server.wait_held(0)
    key = prefix_server.headers["Authorization"].removeprefix("Bearer ")

    def run(name: str) -> dict:
        out = tmp_path / name
        main(["--url", prefix_server.ws, "--sessions", "1", "--frames", "21", "--api-key", key, "--out", str(out)])
        return json.loads(out.read_text())["runs"][0]["summary"]

    assert run("a.json")["cached_chunks"] == 0 and run("b.json")["cached_chunks"] == 0
    monkeypatch.setattr(serve_load, "invocation_tag", lambda: "same")
    assert run("c.json")["cached_chunks"] == 0
    again = run("d.json")
    assert again["cached_chunks"] == 2 and again["completed"] == 1  # both chunks from the store
    assert "2 chunks came from the server's prefix store" in (tmp_path / "d.txt").read_text()
    prefix_server.wait_held(0)


def test_branch_bench_forks_and_rewinds_through_the_server(prefix_server, tmp_path):
    """benchmarks/branch_bench.py (run on the GPU by gpu_serve.sh BRANCH=1) against the CPU app
    with the prefix store and snapshots on: a cold session, the same inputs on a second socket
    (served from the store), a fork at the last chunk (a live copy), one below it and a rewind
    (copies of snapshots), a session leaving the store (from a snapshot); on CPU float32 the
    second session's and the rewound chunk's videos equal the first's."""
    from benchmarks.branch_bench import main as branch_main

    server = prefix_server
    server.wait_held(0)
    out = tmp_path / "branch.json"
    key = server.headers["Authorization"].removeprefix("Bearer ")
    assert branch_main(["--url", server.ws, "--chunks", "3", "--api-key", key, "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["cold"]["ttfc_s"] > 0 and r["cold"]["dit_step_mean_s"] > 0
    assert r["hit"]["cached"] == 3 and r["hit"]["video_equal"] == 3  # from the store, the same bytes
    assert r["hit"]["ttfc_s"] < r["cold"]["ttfc_s"]
    assert r["fork"]["at_chunk"] == 3 and 0 < r["fork"]["forked_s"] <= r["fork"]["fork_to_frame_s"]
    assert r["fork"]["frame_dit_s"] > 0
    assert r["fork"]["path"] == {"dit": "clone", "vae": "clone"}  # at the head: both copy the live session
    assert r["fork"]["video_equal_to_parent"] is True
    assert r["fork_below"]["at_chunk"] == 1 and r["fork_below"]["path"] == {"dit": "snapshot", "vae": "snapshot"}
    assert r["rewind"]["to_chunk"] == 2 and r["rewind"]["video_equal"] is True
    assert r["rewind"]["path"] == {"dit": "snapshot", "vae": "snapshot"}
    assert r["leave"]["cached"] == 1 and r["leave"]["path"] == {"dit": "snapshot", "vae": "snapshot"}
    assert r["snapshots"]["dit"]["held"] >= 3 and r["snapshots"]["dit"]["mib_per_snapshot"] > 0
    assert set(r["replicas"]["replicas"]) == {"text_encoder", "vae", "dit"}
    server.wait_held(0)


def test_serve_load_drive_measures_control_lag_against_the_server(server, tmp_path):
    """`serve_load --drive` (benchmarks/drive_load.py) against the CPU app: two presses of two
    chunks each, a short pause between; the lags and the DiT step come from the replies, no
    chunk arrives while paused, the ack window holds."""
    server.wait_held(0)
    out = tmp_path / "drive.json"
    main(["--drive", "--url", server.ws, "--presses", "2", "--hold-chunks", "2", "--pause-s", "1.5",
          "--out", str(out)])
    results = json.loads(out.read_text())
    (run,) = results["runs"]
    s = run["summary"]
    assert run["mode"] == "drive" and s["presses"] == 2 and not s["errors"]
    assert 0 < s["control_lag_p50_s"] <= s["control_lag_p95_s"] < 60
    assert s["press_lag_p50_s"] > 0 and s["change_lag_p50_s"] > 0  # from the pause, and while moving
    assert s["interval_p50_s"] > 0 and s["dit_step_p50_s"] > 0 and s["release_lag_p50_s"] > 0
    assert s["chunks_while_paused"] == 0 and s["paused_s"] >= 1.5
    assert s["window_ok"] and 1 <= s["max_unacked_seen"] <= 2
    presses = run["raw_presses"]
    assert [p["keys"] for p in presses] == [["w"], ["l"]]
    # Each press's first frame carries its event id (or a later one), never an older key state.
    assert all(p["frames"][0]["event_id"] >= p["event_id"] and len(p["frames"]) >= 2 for p in presses)
    assert [p["change_keys"] for p in presses] == [["l"], ["w", "j"]] and all(p["change_lag_s"] > 0 for p in presses)
    # Each change is sent at a random moment of the chunk that runs (within the last interval),
    # and its lag counts from when it was sent, not from the frame it waited after.
    assert s["change_phase"] == "random" and all(p["change_delay_s"] > 0 for p in presses)
    assert all(p["change_sent_s"] >= p["frames"][-1]["received_s"] + p["change_delay_s"] - 0.01 for p in presses)
    assert set(run["replicas_after"]["replicas"]) == {"text_encoder", "vae", "dit"}
    assert "control lag p50" in out.with_suffix(".txt").read_text()
    server.wait_held(0)
