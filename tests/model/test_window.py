"""Open-ended sessions with the rolling window (issue 15): the caches are allocated at open and
never grow, the window stays full once it filled; the window benchmark's CPU smoke run."""
from __future__ import annotations

import json

import pytest
import torch

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


def test_the_window_benchmark_times_the_cache_update_and_compares_the_whole_call(tmp_path):
    """bf16+whole runs the cache update as the whole t = 0 call: the same latents as write_kv's;
    each row times the deferred update apart (inside the chunk's time)."""
    out = tmp_path / "u.json"
    main(["--preset", "tiny", "--device", "cpu", "--size", "32*48", "--chunks", "4", "--precisions",
          "bf16,bf16+whole", "--local", "3", "--sink", "0", "--save-latents", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    for run in runs.values():
        assert all(0 < r["update_s"] < r["dit_s"] for r in run["per_chunk"])
        assert run["summary"]["mean_update_s"] > 0
    kv_only, whole = (torch.load(tmp_path / f"u_{tag}_latents.pt") for tag in ("bf16", "bf16_whole"))
    assert kv_only.shape[0] == 4 and torch.equal(kv_only, whole)


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


def test_kind_rates_count_five_calls_over_the_full_window():
    from benchmarks.window import kind_rates
    from model.config import preset

    cfg = preset("lingbot-world-fast").dit
    seconds = {"attention": 0.5, "gemm": 0.4, "elementwise": 0.1}
    rates = kind_rates(cfg, 464, 832, 15, seconds)
    tokens, keys = 3 * 29 * 52, 15 * 29 * 52  # 4524 queries, 22620 keys
    # self + cross attention: 4 S n D FLOPs per layer and call, 4 denoising calls + the update
    assert rates["attention"]["tflop"] * 1e12 == 5 * cfg.num_layers * 4 * tokens * cfg.dim * (keys + cfg.text_len)
    assert rates["attention"]["tflops"] == rates["attention"]["tflop"] / 0.5
    assert rates["floor_s"] == 0.9  # the elementwise kernels are not the floor's
    doubled = kind_rates(cfg, 464, 832, 30, seconds)
    assert doubled["gemm"]["tflop"] == rates["gemm"]["tflop"]  # the window changes attention only
    assert kind_rates(cfg, 464, 832, 15, {"gemm": 0.4})["attention"]["tflops"] is None  # not profiled: no rate


def test_the_window_benchmark_runs_the_code_cache_variants(tmp_path, fake_cudnn, monkeypatch):
    """fp8 variants, one session each on the same quantized weights: the ring (default), the
    shifting window and the bound scales; with a stand-in cuDNN on the CPU."""
    import torch

    from model.accel import transforms

    monkeypatch.setattr(transforms, "fp8_attention_available", lambda device: True)
    out = tmp_path / "w.json"
    main(["--preset", "tiny", "--device", "cpu", "--size", "32*48", "--chunks", "5", "--local", "9", "--sink", "3",
          "--precisions", "bf16,fp8,fp8+shift,fp8+bound", "--fp8-attention", "--kv-codes", "--save-latents",
          "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["bf16", "fp8", "fp8+shift", "fp8+bound"]
    latents = {name: torch.load(tmp_path / f"w_{name.replace('+', '_')}_latents.pt") for name in runs}
    frame_tokens = (32 // 8) * (48 // 8) // 4
    for name in ("fp8", "fp8+shift", "fp8+bound"):
        assert [r["kv_local_end"] for r in runs[name]["per_chunk"]] == [3 * frame_tokens, 6 * frame_tokens] + [
            9 * frame_tokens] * 3  # full from chunk 2 on; chunks 3 and 4 wrap around the ring
        err = ((latents[name] - latents["bf16"]).norm() / latents["bf16"].norm()).item()
        assert 0 < err < 0.2, (name, err)
    assert [(runs[n]["kv_ring"], runs[n]["qk_bound_scales"]) for n in list(runs)[1:]] == [
        (True, False), (False, False), (True, True)]
    assert runs["bf16"]["kv_ring"] is False  # the CPU's plain path: the reference's shifting window
    # the ring and the shifting window hold the same keys in another order (the attention's
    # e4m3 output mostly rounds the sums' order away)
    torch.testing.assert_close(latents["fp8"], latents["fp8+shift"], rtol=0, atol=5e-2 * latents["fp8"].abs().max().item())
    assert not torch.equal(latents["fp8+bound"], latents["fp8"])
    with pytest.raises(SystemExit, match="kv-codes"):
        main(["--preset", "tiny", "--device", "cpu", "--precisions", "fp8+bound", "--out", str(out)])
