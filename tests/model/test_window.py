"""Open-ended sessions with the rolling window (issue 15): the caches are allocated at open and
never grow, the window stays full once it filled; the window benchmark's CPU smoke run."""
from __future__ import annotations

import json

from benchmarks.window import main


def test_an_open_ended_session_keeps_its_memory_fixed(tmp_path):
    out = tmp_path / "window.json"
    main(["--preset", "tiny", "--device", "cpu", "--size", "32*48", "--chunks", "8", "--precisions", "bf16",
          "--local", "6", "--sink", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = result["runs"]["bf16"]["per_chunk"]
    assert len(rows) == 8
    assert len({r["cache_bytes"] for r in rows}) == 1  # allocated at open, never grown
    frame_tokens = (32 // 8) * (48 // 8) // 4
    assert [r["kv_local_end"] for r in rows] == [3 * frame_tokens, 6 * frame_tokens] + [6 * frame_tokens] * 6
    assert rows[-1]["kv_global_end"] == 8 * 3 * frame_tokens  # positions keep counting (RoPE offset)
    assert result["runs"]["bf16"]["summary"]["window_full_from_chunk"] == 2


def test_the_window_benchmark_profiles_a_steady_state_chunk(tmp_path):
    out = tmp_path / "w.json"
    main(["--preset", "tiny", "--device", "cpu", "--size", "32*48", "--chunks", "3", "--precisions", "bf16",
          "--local", "3", "--sink", "0", "--profile", "--out", str(out)])
    run = json.loads(out.read_text())["runs"]["bf16"]
    assert len(run["per_chunk"]) == 3  # the profiled chunk is not a timed row
    assert run["profile"]["wall_s"] > 0
    table = (tmp_path / "w_bf16_profile.txt").read_text()
    assert "aten::" in table  # the model's ops were recorded
    assert (tmp_path / "w_bf16_profile_shapes.txt").read_text().count("[") > 0
