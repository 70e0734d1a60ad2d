"""benchmarks/results/: the latest result of each benchmark, and SUMMARY.md generated from them."""
from __future__ import annotations

import json

from benchmarks.summary import RESULTS, SUMMARY, render, rows_of

MAX_RESULT_FILES = 40  # issue 32: the latest of each benchmark; the rest is in git history


def test_the_summary_is_what_the_json_results_give():
    """Rerun `python -m benchmarks.summary` after adding or removing a result."""
    assert SUMMARY.read_text() == render(RESULTS)


def test_every_json_result_has_a_row_and_results_stay_few():
    files = sorted(RESULTS.glob("*.json"))
    text = SUMMARY.read_text()
    assert all(f"`{f.name}`" in text for f in files)
    assert len([p for p in RESULTS.iterdir() if p.name != "SUMMARY.md"]) <= MAX_RESULT_FILES


def test_rows_name_the_headline_figures_of_each_kind():
    served = {"config": {"frames": 81}, "server_before": {}, "runs": [{"summary": {
        "sessions": 2, "completed": 2, "refused_busy": 0, "interval_p50_s": 3.5, "dit_step_mean_s": 1.75,
        "aggregate_fps": 6.36}}]}
    assert rows_of(served) == [("serve_load (81 frames)",
                                "2 sessions, 2 served, 0 busy: interval p50 3.5 s, DiT step 1.75 s, 6.36 frames/s")]
    assert rows_of({"world": 2, "steady_chunk_s": 1.0077, "all_to_all_share": 0.0386}) == [
        ("sp_bench (world 2)", "steady chunk 1.01 s, all-to-all 3.86 %")]
    drive = {"config": {}, "server_before": {}, "runs": [{"mode": "drive", "summary": {
        "presses": 8, "control_lag_p50_s": 2.119, "control_lag_p95_s": 2.8, "lag_over_dit_decode": 1.2887,
        "chunks_while_paused": 0}}]}
    assert rows_of(drive) == [("serve_load --drive", "8 presses: control lag p50 2.12 s (1.29 x DiT step + decode), "
                                                     "p95 2.8 s, 0 chunks while paused")]
    assert rows_of({"starts": [], "healthy_s": {"cold": 160.1, "warm": 76.8}}) == [
        ("ready", "cold 160 s to healthy, warm 76.8 s to healthy")]
    clone = {"chunks": 20, "dit_clone_s": [0.015, 0.0096], "dit_session_bytes": 18949734400, "dit_restore_s": 8.28,
             "clone_next_equal": True, "clone_next_rel_err": 0.0, "restore_next_equal": False,
             "restore_next_rel_err": 0.0123}
    assert rows_of(clone) == [("clone_bench", "20 chunks: DiT clone 9.6 ms (17.6 GiB), journal rebuild 8.28 s; "
                                              "next latents: clone equal, rebuild rel err 1.23e-02")]
    auto = {"busy_to_constructor_s": 21.5, "busy_to_ready_s": 35.25, "busy_to_first_frame_s": 37.0,
            "constructor_s": {"first": 22.1, "new": 13.7}, "new_replica": {"load_s": 5.3, "warmup_s": 6.5}}
    assert rows_of(auto) == [("autoscale_ready", "busy -> new DiT replica's constructor 21.5 s, ready 35.2 s (load 5.3 s, "
                                                 "warm-up 6.5 s; first replica's constructor 22.1 s), B's frame 37 s")]
    first = {"load_s": 6.9, "warmup_s": 13.4, "sessions": [
        {"inputs": "warm-up's", "chunks": [{"step_s": 0.5972, "moved": {}}]},
        {"inputs": "moving camera", "chunks": [{"step_s": 0.9078, "moved": {"device_allocs": 3}}]}]}
    assert rows_of(first) == [("first_chunk", "chunk 0's step after the warm-up, session by session: warm-up's "
                                              "0.597 s; moving camera 0.908 s (device_allocs 3)")]
    assert rows_of({"something": 1})[0][0] == "probe"


def test_summary_reads_a_folder_it_is_given(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"reconnect_s": 0.02, "replayed": 1, "first_frame_after_connect_s": 1.5}))
    assert "| `a.json` | resume_drill | reconnect 0.02 s, replayed 1, first frame after connect 1.5 s |" in render(tmp_path)
    one = {"reconnect_s": 0.03, "replayed": 2, "first_frame_after_connect_s": 1.2, "identical_chunks": 3, "chunks": 5}
    (tmp_path / "b.json").write_text(json.dumps({"store_off": one, "store_on": {**one, "identical_chunks": 5}}))
    table = render(tmp_path)
    assert ("| `b.json` | resume_drill (store off) | reconnect 0.03 s, replayed 2, first frame after connect 1.2 s, "
            "identical 3 of 5 |") in table
    assert "| `b.json` | resume_drill (store on) | reconnect 0.03 s, replayed 2, first frame after connect 1.2 s, identical 5 of 5 |" in table
    kill = {"first_frame_after_kill_s": 41.5, "identical_chunks": 5, "chunks": 5}
    (tmp_path / "c.json").write_text(json.dumps({"kill": kill}))
    assert ("| `c.json` | recovery_drill | DiT replica killed, first frame after the kill 41.5 s, identical 5 of 5 |"
            in render(tmp_path))


def test_rows_of_the_world_and_sharing_benchmarks():
    """benchmarks/worlds/ and benchmarks/sharing/ results (issues 55, 56), alone or in a bundle of parts."""
    store = {"backend": "s3", "size": [464, 832], "bytes_per_chunk": {"first": 2678744, "median": 1230836},
             "write_s": {"p50": 0.0214, "p95": 0.0541}, "open_s": {"10": 0.0992, "100": 1.82}}
    assert rows_of(store) == [("world store (s3)", "464x832: 1.17 MiB a chunk (first 2.55), write p50 0.0214 s, "
                                                   "p95 0.0541 s; open 10 chunks 0.0992 s, 100 chunks 1.82 s")]
    opened = {"chunks_built": 51, "opened": {"50": {"open_to_first_new_chunk_s": 4.2, "identical": True}},
              "replay": {"to_chunk_s": {"50": 40.5}}}
    assert rows_of(opened) == [("world open vs replay", "50 chunks: open -> first new chunk 4.2 s, replay 40.5 s, "
                                                        "identical True")]
    watch = {"baseline_interval_s": 1.2, "runs": [
        {"viewers": 0, "interval_ratio": 1.0, "chunks_skipped": 0},
        {"viewers": 100, "interval_ratio": 1.02, "chunks_skipped": 0, "lag_s": {"p50": 0.012, "p95": 0.05},
         "ingress_rss_mib": {"per_viewer_kib": 61.5}}]}
    assert rows_of(watch) == [("watch_load", "100 viewers: owner's interval 1.02 x none, lag p50 0.012 s, p95 0.05 s, "
                                             "0 skipped, ingress 61.5 KiB a viewer")]
    drill = {"sessions": {"a": {}, "b": {}}, "resumed_at_chunk": 2, "identical_chunks": 10, "of_chunks": 10,
             "time_to_healthy_s": 85.1}
    assert rows_of(drill) == [("restart_drill", "2 sessions resumed after the restart: identical 10 of 10, healthy "
                                                "again 85.1 s after serve run")]
    assert rows_of({"what": "cpu", "parts": {"s3": store, "watch": watch}}) == [
        ("world store (s3) [s3]", rows_of(store)[0][1]), ("watch_load [watch]", rows_of(watch)[0][1])]
