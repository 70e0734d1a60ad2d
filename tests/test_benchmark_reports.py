"""The benchmarks' own arithmetic: idle gaps from a trace, kernel kinds, the FP8 rows of the report."""
from __future__ import annotations

from benchmarks.gaps import HostFrames, idle_gaps
from benchmarks.report import dit_rows, summary
from benchmarks.run import kernel_kind


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


def test_the_report_lists_fp8_variants_and_takes_the_fastest():
    run = lambda total: {"chunk_s": [total / 2] * 2, "total_s": total, "mean_chunk_s": total / 2}  # noqa: E731
    stages = {"compile": {**run(10.8), "kept": True},
              "fp8": {"quantize_s": 0.2, "fastest": "fp8_b", "fp8_a": run(9.5), "fp8_b": run(8.7),
                      "fp8_c": {"error": "Traceback"}}}
    rows = dit_rows(stages)
    assert [name for name, _ in rows] == ["eager_bf16", "fast_flash", "fast_cudnn", "compile", "fp8_a", "fp8_b",
                                          "fp8_c"]
    out = summary({"stages": stages})
    assert out["dit_total_s"] == 10.8 and out["dit_fp8_total_s"] == 8.7
    # round 1's layout: the fp8 stage's own series
    assert summary({"stages": {"fp8": run(9.4)}})["dit_fp8_total_s"] == 9.4
