"""Profiles of the benchmark's runs: per-op tables (and per op and input shapes), device time
per kernel kind, the time the device was busy."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from benchmarks.build import Inputs
from model.engines import VaeEngine


def self_time_key(device: torch.device) -> str:
    return "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"


def top_ops(prof: object, device: torch.device, path: Path, rows: int) -> dict:
    events = prof.key_averages()
    key = self_time_key(device)
    path.write_text(events.table(sort_by=key, row_limit=40))
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:rows]
    return {"self_time_total_ms": sum(getattr(e, key) for e in events) / 1e3,
            "top": [{"op": e.key, "ms": getattr(e, key) / 1e3, "calls": e.count} for e in top]}


def profiler(record_shapes: bool = False) -> object:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=activities, record_shapes=record_shapes)


def profile_vae(engine: VaeEngine, inputs: Inputs, latents: list[torch.Tensor], path: Path) -> dict:
    """Device time per op of the second chunk's conditioning encode and decode; beside `path`
    the same per (op, input shapes) (`*_shapes.txt`: which layers the copies belong to)."""
    from torch.profiler import record_function

    path.parent.mkdir(parents=True, exist_ok=True)
    session = engine.open(inputs.image, inputs.height, inputs.width)
    engine.condition(session)
    engine.decode_float(session, latents[0])
    with profiler(record_shapes=True) as prof:
        with record_function("vae_encode"):
            engine.condition(session)
        with record_function("vae_decode"):
            engine.decode_float(session, latents[1])
    engine.close(session)
    write_shapes_table(prof, engine.device, path)
    return top_ops(prof, engine.device, path, 15)


def write_shapes_table(prof: object, device: torch.device, path: Path) -> None:
    """The profile per (op, input shapes) beside `path` (`*_shapes.txt`): which layer a copy or
    a slow kernel belongs to (the profiler must have recorded shapes)."""
    by_shape = prof.key_averages(group_by_input_shape=True)
    path.with_name(path.stem + "_shapes.txt").write_text(by_shape.table(
        sort_by=self_time_key(device), row_limit=80, max_name_column_width=40, max_shapes_column_width=120))


KERNEL_KINDS = (  # (kind, substrings of a device kernel's name), first match wins
    ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma", "cublas")),
    ("attention", ("sdpa", "fmha", "flash", "attn", "attention")),
    ("compiled", ("triton_",)),
    ("copy", ("memcpy", "memset", "copy", "cat")),
    ("elementwise", ("elementwise", "reduce", "norm")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def device_time_by_kind(events) -> dict[str, float]:
    """Seconds of device time per kernel kind in profiler averages: the device's own events only
    (kernels, copies, memsets). The device-side ranges of annotations (inductor's `## Call
    CompiledFxGraph`, `record_function`) span kernels counted already and are left out."""
    kinds: dict[str, float] = {}
    for e in events:
        # `is_user_annotation` may be missing in older profilers; inductor's ranges are "## ... ##"
        annotation = getattr(e, "is_user_annotation", False) or e.key.startswith("## ")
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0 and not annotation:
            kinds[kernel_kind(e.key)] = kinds.get(kernel_kind(e.key), 0.0) + e.self_device_time_total / 1e6
    return kinds


def device_busy_s(prof: object) -> float:
    """Seconds during which at least one kernel, copy or memset ran (from the profile's trace)."""
    import tempfile

    from benchmarks.probes.gaps import idle_gaps

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        busy_us, _, _ = idle_gaps(json.loads(trace.read_text())["traceEvents"], math.inf)
    return busy_us / 1e6


def profile_report(prof: object, device: torch.device, path: Path, shapes: object | None = None) -> dict:
    """Write `prof`'s per-op table at `path` and the per (op, input shapes) one beside it (from
    `shapes`, a profile that recorded them; else `prof`); device time per kernel kind and busy time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=self_time_key(device), row_limit=60))
    write_shapes_table(prof if shapes is None else shapes, device, path)
    return {"device_s_by_kind": device_time_by_kind(prof.key_averages()), "device_busy_s": device_busy_s(prof)}
