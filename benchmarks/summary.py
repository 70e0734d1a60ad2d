"""The table of benchmarks/results/: one row per JSON result, its headline figures.

    python -m benchmarks.summary            # rewrites benchmarks/results/SUMMARY.md
    python -m benchmarks.summary --check    # exit 1 when SUMMARY.md is not what the JSON files give

Each result's kind is read from its shape (the keys its benchmark writes); the figures are the
ones docs/PERFORMANCE.md quotes. tests/test_benchmark_summary.py keeps SUMMARY.md up to date.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from benchmarks.report import summary as run_summary

RESULTS = Path(__file__).resolve().parent / "results"
SUMMARY = RESULTS / "SUMMARY.md"

Row = tuple[str, str]  # (benchmark, headline figures)


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def run_rows(d: dict) -> list[Row]:
    rows = []
    if s := run_summary(d):
        rows.append(("run (DiT, 81 frames)", ", ".join(f"{k} {fmt(v)}" for k, v in sorted(s.items()))))
    vae = d["stages"].get("vae_only", {})
    for name, r in vae.items():
        if isinstance(r, dict) and "mean_decode_s" in r:
            rows.append(("run --vae-only", f"{name.removeprefix('vae_')}: decode {fmt(r['mean_decode_s'])} s, "
                                           f"encode {fmt(r['mean_encode_s'])} s per chunk"))
    return rows or [("run", "no kept stage")]


def window_rows(d: dict) -> list[Row]:
    opts = ", ".join(f"{k}" for k in ("fp8_attention", "kv_codes", "kv_fp8") if d.get(k))
    head = f"window ({d.get('attention', '?')}{', ' + opts if opts else ''})"
    return [(head, f"{name}: DiT chunk {fmt(r['summary']['mean_dit_s'])} s (window full from chunk "
                   f"{r['summary'].get('window_full_from_chunk', '?')})") for name, r in d["runs"].items()]


def serve_load_rows(d: dict) -> list[Row]:
    cfg = d["config"]
    mode = "open-ended" if cfg.get("open_ended") else f"{cfg['frames']} frames"
    rows = []
    for r in d["runs"]:
        s = r["summary"]
        rows.append((f"serve_load ({mode})",
                     f"{s['sessions']} sessions, {s['completed']} served, {s['refused_busy']} busy: interval p50 "
                     f"{fmt(s['interval_p50_s'])} s, DiT step {fmt(s['dit_step_mean_s'])} s, "
                     f"{fmt(s['aggregate_fps'])} frames/s"))
    return rows


def drive_rows(d: dict) -> list[Row]:
    rows = []
    for r in d["runs"]:
        s = r["summary"]
        rows.append(("serve_load --drive",
                     f"{s['presses']} presses: control lag p50 {fmt(s['control_lag_p50_s'])} s "
                     f"({fmt(s['lag_over_dit_decode'])} x DiT step + decode), p95 {fmt(s['control_lag_p95_s'])} s, "
                     f"{s['chunks_while_paused']} chunks while paused"))
    return rows


def ready_rows(d: dict) -> list[Row]:
    return [("ready", ", ".join(f"{label} {fmt(s)} s to healthy" for label, s in d["healthy_s"].items()))]


def branch_rows(d: dict) -> list[Row]:
    def path(phase: dict) -> str:
        p = phase.get("path") or {}
        return "/".join(p.get(name, "?") for name in ("dit", "vae"))

    def fork(phase: dict) -> str:  # a fork skipped on one seat says why (benchmarks/line/seats.py)
        if "skipped" in phase:
            return f"fork at the head skipped ({phase['skipped']})"
        return (f"fork at the head to its frame {fmt(phase['fork_to_frame_s'])} s ({path(phase)}; target "
                f"{fmt(phase['target_s'])} s)")

    rows = [("branch_bench", f"{d['chunks']} chunks: TTFC cold {fmt(d['cold']['ttfc_s'])} s, full hit "
                             f"{fmt(d['hit']['ttfc_s'])} s ({d['hit']['cached']} cached, {d['hit']['video_equal']} "
                             f"videos equal); {fork(d['fork'])}")]
    for name, key in (("fork below the head", "fork_below"), ("rewind", "rewind")):
        if key in d and "skipped" not in d[key]:
            rows.append(("branch_bench", f"{name} to its frame {fmt(d[key][key.split('_')[0] + '_to_frame_s'])} s "
                                         f"({path(d[key])})"))
    if "leave" in d:
        rows.append(("branch_bench", f"leaving the store after {d['leave']['at_chunk']} chunks: first computed "
                                     f"{fmt(d['leave']['first_computed_s'])} s ({path(d['leave'])})"))
    for name, shelf in (d.get("snapshots") or {}).items():
        if shelf.get("mib_per_snapshot"):
            rows.append(("branch_bench", f"{name} snapshot {fmt(shelf['mib_per_snapshot'] / 1024)} GiB, "
                                         f"{shelf['held']} held"))
    return rows


def clone_rows(d: dict) -> list[Row]:
    def same(what: str) -> str:
        return "equal" if d[f"{what}_next_equal"] else f"rel err {d[f'{what}_next_rel_err']:.2e}"

    return [("clone_bench", f"{d['chunks']} chunks: DiT clone {fmt(1e3 * min(d['dit_clone_s']))} ms "
                            f"({fmt(d['dit_session_bytes'] / 2**30)} GiB), journal rebuild {fmt(d['dit_restore_s'])} s; "
                            f"next latents: clone {same('clone')}, rebuild {same('restore')}")]


def autoscale_rows(d: dict) -> list[Row]:
    new = d["new_replica"]
    return [("autoscale_ready", f"busy -> new DiT replica's constructor {fmt(d['busy_to_constructor_s'])} s, ready "
                                f"{fmt(d['busy_to_ready_s'])} s (load {fmt(new['load_s'])} s, warm-up "
                                f"{fmt(new['warmup_s'])} s; first replica's constructor {fmt(d['constructor_s']['first'])} s), "
                                f"B's frame {fmt(d['busy_to_first_frame_s'])} s")]


def first_chunk_rows(d: dict) -> list[Row]:
    def firsts(s: dict) -> str:
        c = s["chunks"][0]
        return f"{fmt(c['step_s'])} s" + (f" ({', '.join(f'{k} {v}' for k, v in c['moved'].items())})" if c["moved"] else "")

    return [("first_chunk", "chunk 0's step after the warm-up, session by session: "
                            + "; ".join(f"{s['inputs']} {firsts(s)}" for s in d["sessions"]))]


def load_weights_rows(d: dict) -> list[Row]:
    return [("load_weights", f"{fmt(d['load_GBps'])} GB/s from {d['file_system']} ({d['storage_dtype']}, "
                             f"{d['num_layers']} of {d['released_num_layers']} blocks; old loader "
                             f"{fmt(d['reference_GBps'])} GB/s), equal {d['equal']}")]


def capacity_rows(d: dict) -> list[Row]:
    return [("capacity", f"{s['name']}: {s['admitted']} admitted") for s in d["scenarios"]]


def sp_rows(d: dict) -> list[Row]:
    return [(f"sp_bench (world {d['world']})", f"steady chunk {fmt(d['steady_chunk_s'])} s, "
                                               f"all-to-all {fmt(100 * d.get('all_to_all_share', 0.0))} %")]


def _is_resume_drill(d: dict) -> bool:
    """benchmarks/resume_drill.py's output: one run (older files), runs per store, a kill run."""
    return "reconnect_s" in d or "kill" in d or any(k.startswith("store_") for k in d)


def resume_rows(d: dict) -> list[Row]:
    runs = {"resume_drill": d} if "reconnect_s" in d else {
        f"resume_drill (store {k.removeprefix('store_')})": v for k, v in d.items() if k.startswith("store_")}
    rows = []
    for kind, r in runs.items():
        identical = f", identical {r['identical_chunks']} of {r['chunks']}" if "identical_chunks" in r else ""
        rows.append((kind, f"reconnect {fmt(r['reconnect_s'])} s, replayed {r['replayed']}, "
                           f"first frame after connect {fmt(r['first_frame_after_connect_s'])} s{identical}"))
    if "kill" in d:
        k = d["kill"]
        rows.append(("recovery_drill", f"DiT replica killed, first frame after the kill "
                                       f"{fmt(k['first_frame_after_kill_s'])} s, identical {k['identical_chunks']} "
                                       f"of {k['chunks']}"))
    return rows


def gaps_rows(d: dict) -> list[Row]:
    return [(f"gaps ({d['precision']})", f"device busy {fmt(100 * d['busy_fraction'])} %, {d['gaps']} gaps")]


def attention_rows(d: dict) -> list[Row]:
    rows = []
    for name, row in d["attention"].items():
        tf = {k: fmt(v["tflops"]) for k, v in row.items() if isinstance(v, dict) and "tflops" in v
              and k in ("cudnn", "flash", "fa4", "fa3")}
        rows.append(("attention", f"{name}: " + ", ".join(f"{k} {v} TFLOP/s" for k, v in tf.items())))
    return rows


def models_rows(d: dict) -> list[Row]:
    m = d["data"][0]
    return [("/v1/models after warm-up", ", ".join(f"{k} {m[k]}" for k in ("dtype", "attention", "kv_cache", "fp8")
                                                  if k in m))]


def quant_rows(d: dict) -> list[Row]:
    """The FP8 quantisation kernels (the probe in git history): compiled against the fastest Triton launch."""
    rows = []
    for name, fn in d["quant"].items():
        if isinstance(fn, dict) and "compiled" in fn:
            triton = {k: v["us"] for k, v in fn.items() if k.startswith("triton") and "us" in v}
            best = min(triton, key=triton.get)
            rows.append(("quantisation kernels", f"{name}: compiled {fmt(fn['compiled']['us'])} us, "
                                                 f"{best} {fmt(triton[best])} us, floor {fmt(fn['floor_us'])} us"))
    return rows


def other_rows(d: dict) -> list[Row]:
    return [("probe", "keys: " + ", ".join(sorted(k for k in d if k not in ("torch", "device", "cudnn", "triton"))))]


def arrivals_rows(d: dict) -> list[Row]:
    s = d["summary"]
    return [("serve_load --arrival-rate", f"{s['arrivals']} arrivals, {s['queued']} queued, {s['busy_replies']} busy: "
                                          f"wait p95 {fmt(s['wait_p95_s'])} s, max {fmt(s['wait_max_s'])} s "
                                          f"(bound {fmt(s['starvation_bound_s'])} s); ETA within 30 % "
                                          f"{s['eta_within_30pct']} of {s['eta_judged']}; "
                                          f"frames/s per session p50 {fmt(s['fps_per_session_p50'])}")]


def line_bench_rows(d: dict) -> list[Row]:
    rows = []
    if "line" in d:
        line = d["line"]
        etas = ", ".join(f"{w['eta_s']} s for {fmt(w['actual_wait_s'])} s" for w in line["waiters"] if w.get("waited"))
        rows.append(("line_bench line", f"positions 1 and 2 {line['positions_1_and_2']}, ETAs within 30 % "
                                        f"{line['etas_within_30pct']} ({etas or 'none waited'}), "
                                        f"busy {line['busy_replies']}"))
    if "jobs" in d:
        rows.append(("line_bench jobs", f"live interval with 3 jobs {fmt(d['jobs']['ratio'])} x alone"))
    if "fair" in d:
        rows.append(("line_bench fair", f"pipeline 2 vs 1: {fmt(100 * d['fair']['difference'])} % apart"))
    return rows


def world_store_rows(d: dict) -> list[Row]:
    """benchmarks/worlds/store.py: one backend's bytes, writes and opens."""
    b, w, o = d["bytes_per_chunk"], d["write_s"], d["open_s"]
    opens = ", ".join(f"{n} chunks {fmt(s)} s" for n, s in o.items())
    return [(f"world store ({d['backend']})", f"{d['size'][0]}x{d['size'][1]}: {fmt(b['median'] / 2**20)} MiB a chunk "
                                              f"(first {fmt(b['first'] / 2**20)}), write p50 {fmt(w['p50'])} s, p95 "
                                              f"{fmt(w['p95'])} s; open {opens}")]


def open_replay_rows(d: dict) -> list[Row]:
    """benchmarks/worlds/open_replay.py: open -> first new chunk, against the replay of the same inputs."""
    rows = []
    for n, o in d["opened"].items():
        replay = d.get("replay", {}).get("to_chunk_s", {}).get(n)
        rows.append(("world open vs replay", f"{n} chunks: open -> first new chunk {fmt(o['open_to_first_new_chunk_s'])} s"
                                             f"{'' if replay is None else f', replay {fmt(replay)} s'}, "
                                             f"identical {o['identical']}"))
    return rows


def watch_load_rows(d: dict) -> list[Row]:
    """benchmarks/sharing/watch_load.py: per viewer count, the owner's interval ratio, lag, skips, memory."""
    rows = []
    for r in d["runs"]:
        if not r["viewers"]:
            continue
        lag, mem = r.get("lag_s", {}), r.get("ingress_rss_mib", {})
        rows.append(("watch_load", f"{r['viewers']} viewers: owner's interval {fmt(r['interval_ratio'])} x none, lag p50 "
                                   f"{fmt(lag.get('p50', 0))} s, p95 {fmt(lag.get('p95', 0))} s, {r['chunks_skipped']} "
                                   f"skipped, ingress {mem.get('per_viewer_kib', '?')} KiB a viewer"))
    return rows


def restart_drill_rows(d: dict) -> list[Row]:
    """benchmarks/worlds/restart_drill.py: sessions across a restart of Serve."""
    return [("restart_drill", f"{len(d['sessions'])} sessions resumed after the restart: identical "
                              f"{d['identical_chunks']} of {d['of_chunks']}, healthy again "
                              f"{d.get('time_to_healthy_s', '?')} s after serve run")]


def bundle_rows(d: dict) -> list[Row]:
    """A file of several results (`parts`: name -> one benchmark's result): each part's rows."""
    return [(f"{kind} [{name}]", text) for name, part in d["parts"].items() for kind, text in rows_of(part)]


KINDS: list[tuple[Callable[[dict], bool], Callable[[dict], list[Row]]]] = [
    (lambda d: "stages" in d, run_rows),
    (lambda d: "runs" in d and isinstance(d["runs"], dict), window_rows),
    (lambda d: "runs" in d and "server_before" in d and all(r.get("mode") == "drive" for r in d["runs"]), drive_rows),
    (lambda d: "runs" in d and "server_before" in d, serve_load_rows),
    (lambda d: "healthy_s" in d and "starts" in d, ready_rows),
    (lambda d: "load_GBps" in d and "reference_GBps" in d, load_weights_rows),
    (lambda d: "fork" in d and "hit" in d and "cold" in d, branch_rows),
    (lambda d: "clone_next_equal" in d and "dit_clone_s" in d, clone_rows),
    (lambda d: "busy_to_first_frame_s" in d and "new_replica" in d, autoscale_rows),
    (lambda d: isinstance(d.get("sessions"), list) and "warmup_s" in d and "load_s" in d, first_chunk_rows),
    (lambda d: "scenarios" in d, capacity_rows),
    (lambda d: "world" in d and "steady_chunk_s" in d, sp_rows),
    (lambda d: isinstance(d.get("parts"), dict), bundle_rows),
    (lambda d: "bytes_per_chunk" in d and "open_s" in d, world_store_rows),
    (lambda d: "opened" in d and "chunks_built" in d, open_replay_rows),
    (lambda d: "baseline_interval_s" in d and isinstance(d.get("runs"), list), watch_load_rows),
    (lambda d: "resumed_at_chunk" in d and "identical_chunks" in d, restart_drill_rows),
    (_is_resume_drill, resume_rows),
    (lambda d: "busy_fraction" in d, gaps_rows),
    (lambda d: isinstance(d.get("attention"), dict) and "kv_1_chunks" in d["attention"], attention_rows),
    (lambda d: d.get("object") == "list", models_rows),
    (lambda d: isinstance(d.get("quant"), dict), quant_rows),
    (lambda d: "line_samples" in d and "summary" in d, arrivals_rows),
    (lambda d: "config" in d and ("line" in d or "fair" in d), line_bench_rows),
]


def rows_of(d: dict) -> list[Row]:
    for matches, rows in KINDS:
        if matches(d):
            return rows(d)
    return other_rows(d)


def render(results: Path = RESULTS) -> str:
    lines = ["# Benchmark results: summary", "",
             "Generated by `python -m benchmarks.summary` from the JSON files beside it (do not edit by hand).",
             "What each benchmark measures and how to rerun it: docs/PERFORMANCE.md.", "",
             "| file | benchmark | headline |", "|---|---|---|"]
    for path in sorted(results.glob("*.json")):
        for kind, headline in rows_of(json.loads(path.read_text())):
            lines.append(f"| `{path.name}` | {kind} | {headline} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args()
    text = render()
    if args.check:
        if not SUMMARY.is_file() or SUMMARY.read_text() != text:
            sys.exit(f"{SUMMARY} is out of date: run python -m benchmarks.summary")
        return
    SUMMARY.write_text(text)


if __name__ == "__main__":
    main()
