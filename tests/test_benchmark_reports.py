"""The benchmarks' own arithmetic: idle gaps from a trace, kernel kinds, the FP8 rows of the report."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from benchmarks.probes.gaps import HostFrames, idle_gaps
from benchmarks.report import dit_rows, summary
from benchmarks.run import device_busy_s, device_time_by_kind, kernel_kind
from support import install_fake_fa4


def _kernel(ts: float, dur: float, name: str, corr: int) -> dict:
    return {"ph": "X", "cat": "kernel", "ts": ts, "dur": dur, "name": name, "args": {"correlation": corr}}


def test_idle_gaps_count_overlaps_once_and_name_the_launch_after_a_gap():
    events = [
        _kernel(0, 10, "a", 1),
        _kernel(5, 10, "b", 2),  # overlaps a: busy 0-15
        _kernel(115, 5, "c", 3),  # a 100 µs gap before it
        _kernel(121, 4, "d", 4),  # 1 µs: below the threshold
        {"ph": "X", "cat": "cuda_runtime", "ts": 110, "dur": 1, "tid": 7, "name": "launch", "args": {"correlation": 3}},
        {"ph": "X", "cat": "python_function", "ts": 0, "dur": 200, "tid": 7, "name": "model/dit.py(1): forward"},
        {"ph": "X", "cat": "python_function", "ts": 100, "dur": 20, "tid": 7, "name": "model/camera.py(9): chunk"},
        {"ph": "X", "cat": "python_function", "ts": 100, "dur": 20, "tid": 8, "name": "other thread"},
    ]
    busy, span, gaps = idle_gaps(events, min_us=20)
    assert (busy, span) == (24, 125)
    assert [(g["us"], g["next"], g["correlation"]) for g in gaps] == [(100, "c", 3)]
    assert HostFrames(events)(3) == ["model/dit.py(1): forward", "model/camera.py(9): chunk"]
    assert HostFrames(events)(99) == []
    assert idle_gaps([], 20) == (0.0, 0.0, [])


def test_kernel_kinds():
    assert kernel_kind("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_bias") == "gemm"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_kind("triton_red_fused__to_copy_abs_amax_clamp_div_0") == "compiled"
    assert kernel_kind("Memcpy DtoD (Device -> Device)") == "copy"
    assert kernel_kind("_quantize_rows") == "other"


def _avg(key: str, device: str, us: float, annotation: bool = False) -> SimpleNamespace:
    return SimpleNamespace(key=key, device_type=SimpleNamespace(name=device), self_device_time_total=us,
                           is_user_annotation=annotation)


def test_device_time_by_kind_leaves_out_annotations_and_host_ops():
    events = [
        _avg("nvjet_sm90_qqtst_128x128", "CUDA", 3000),
        _avg("aten::_scaled_mm", "CPU", 3000),  # the host op launching it: same time, not device time
        _avg("triton_red_fused_add_0", "CUDA", 500),
        _avg("## Call CompiledFxGraph abc ##", "CUDA", 500, annotation=True),  # spans the triton kernel
        _avg("Memcpy DtoD (Device -> Device)", "CUDA", 250),
        _avg("Memset (Device)", "CUDA", 0),
        SimpleNamespace(key="## Call CompiledFxGraph def ##", device_type=SimpleNamespace(name="CUDA"),
                        self_device_time_total=500),  # a profiler without the flag
    ]
    assert device_time_by_kind(events) == {"gemm": 0.003, "compiled": 0.0005, "copy": 0.00025}


def test_device_busy_is_the_union_of_the_trace_device_events():
    class Prof:  # what `export_chrome_trace` writes, reduced to what is read
        def export_chrome_trace(self, path: str) -> None:
            events = [_kernel(0, 10, "a", 1), _kernel(5, 10, "b", 2),
                      {"ph": "X", "cat": "gpu_memcpy", "ts": 30, "dur": 5, "name": "Memcpy"},
                      {"ph": "X", "cat": "gpu_user_annotation", "ts": 0, "dur": 100, "name": "## Call ##"},
                      {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1000, "name": "aten::mm"}]
            Path(path).write_text(json.dumps({"traceEvents": events}))

    assert device_busy_s(Prof()) == 20e-6  # 0-15 and 30-35


def test_the_report_lists_fp8_variants_and_takes_the_fastest():
    run = lambda total: {"chunk_s": [total / 2] * 2, "total_s": total, "mean_chunk_s": total / 2}  # noqa: E731
    stages = {"compile": {**run(10.8), "kept": True},
              "fp8": {"quantize_s": 0.2, "fastest": "fp8_b", "fp8_a": run(9.5), "fp8_b": run(8.7),
                      "fp8_c": {"error": "Traceback"}}}
    rows = dit_rows(stages)
    assert [name for name, _ in rows] == ["eager_bf16", "fast_flash", "fast_cudnn", "compile", "compile_fa4",
                                          "compile_fa4_rope", "fp8_a", "fp8_b", "fp8_c"]
    out = summary({"stages": stages})
    assert out["dit_total_s"] == 10.8 and out["dit_fp8_total_s"] == 8.7
    # the FA4 variant counts as the exact path's number only where it was kept (faster)
    assert summary({"stages": {**stages, "compile_fa4": {**run(10.9), "kept": False}}})["dit_total_s"] == 10.8
    assert summary({"stages": {**stages, "compile_fa4": {**run(9.9), "kept": True}}})["dit_total_s"] == 9.9
    assert summary({"stages": {**stages, "compile_fa4": {"error": "Traceback"}}})["dit_total_s"] == 10.8
    # and the FA4 + Triton RoPE variant after it likewise
    both = {**stages, "compile_fa4": {**run(9.9), "kept": True}}
    assert summary({"stages": {**both, "compile_fa4_rope": {**run(9.6), "kept": True}}})["dit_total_s"] == 9.6
    assert summary({"stages": {**both, "compile_fa4_rope": {**run(10.0), "kept": False}}})["dit_total_s"] == 9.9
    # round 1's layout: the fp8 stage's own series
    assert summary({"stages": {"fp8": run(9.4)}})["dit_fp8_total_s"] == 9.4


def test_the_fa4_benchmark_feeds_the_cute_kernel_its_native_layout(monkeypatch):
    """benchmarks.probes.attention.fa4 hands [S, H, D] rows to flash_attn.cute as [B, S, H, D] and
    reads [S, H * D] back from its (out, lse) pair: checked against SDPA with a stand-in module
    (the real kernel needs an sm_90 GPU)."""
    import torch

    from benchmarks.probes.attention import fa4, sdpa

    calls = install_fake_fa4(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 3, 8, generator=gen) for n in (5, 7, 7))
    out = fa4(q, k, v)
    assert calls == [(5, 7)]
    assert out.shape == (5, 24)
    torch.testing.assert_close(out, sdpa(q, k, v, None))


def test_the_model_benchmark_runs_through_on_the_tiny_model(tmp_path):
    """`benchmarks.run` end to end on the CPU tiny model (what the GPU runs at full size): every
    stage completes but FA4's (CUDA only); a VAE variant this device cannot build (a Triton
    kernel) is recorded as an error and the pipeline goes on with the fastest one that ran,
    through the end-to-end session. A session of one numerics chunk still has its first call."""
    from benchmarks.run import main

    out = tmp_path / "bench.json"
    main(["--preset", "tiny", "--device", "cpu", "--frames", "33", "--max-area", "32*48", "--e2e-repeats", "1",
          "--numerics-chunks", "1", "--out", str(out)])
    stages = json.loads(out.read_text())["stages"]
    errors = {name for name, stage in stages.items() if "error" in stage}
    assert errors <= {"compile_fa4", "compile_fa4_rope"}, {n: stages[n]["error"][-400:] for n in errors}
    pipeline = stages["pipeline"]
    assert "error" in pipeline["vae_bf16_compiled_batched_2x2_triton_stem"]
    assert "error" not in pipeline[f"vae_{pipeline['vae_variant']}"]
    assert len(pipeline["e2e"]["chunk_total_s"]) == 3 and pipeline["e2e"]["time_to_first_chunk_s"] > 0
    assert stages["fast_cudnn"]["first_call_rel_err_vs_fp32"] < 1e-2


def test_the_model_benchmark_holds_itself_to_an_80_gb_cards_memory_on_a_larger_card(monkeypatch):
    """`--memory-gib`: the process is capped at that share of the card, and what the benchmark
    decides from the card's size (the T5 in int8 under 100 GiB) reads the cap, not the card."""
    import torch

    from benchmarks.measure import GIB
    from benchmarks.run import Bench, parse_args
    from deployments.replicas.memory import CARD_BYTES_ENV

    fractions: list[float] = []
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the cap's LWF_CARD_BYTES stays in this test
    os.environ.pop(CARD_BYTES_ENV, None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=140 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _: "a 140 GiB card")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, *_: fractions.append(f))
    argv = ["--preset", "tiny", "--frames", "33", "--max-area", "32*48"]

    whole = Bench(parse_args(argv))
    assert fractions == [] and whole.card_bytes() == 140 * GIB
    assert whole.results["config"]["memory_cap_gib"] is None

    capped = Bench(parse_args(argv + ["--memory-gib", "78.5"]))
    assert fractions == [78.5 / 140] and capped.card_bytes() == int(78.5 * GIB)
    assert capped.results["config"]["memory_cap_gib"] == 78.5 and capped.card_bytes() < 100 * GIB
