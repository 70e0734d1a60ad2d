"""Process counters that say what a slow model call spent its time on inside the replica.

A call that runs far longer than its kind usually does (the `slow call` log line of
SessionHost) without waiting for the compute lock stalled inside the process. The usual causes
leave a trace in counters that are cheap to read before and after each call:

- `compiled_graphs`: torch.compile built a graph (a shape or guard the warm-up did not cover);
- `alloc_retries` / `ooms`: the CUDA caching allocator hit the process cap
  (`set_per_process_memory_fraction`), freed its cached blocks and retried: a device-wide sync;
- `device_allocs` / `device_frees`: cudaMalloc / cudaFree (or segment maps) during the call: the
  cache grew or was emptied (a cuDNN autotuning run allocates its workspaces this way).

Only the counters that moved are logged, so a stall with none of them points elsewhere (the
card's time-slicing with the other processes on it, the host).
"""
from __future__ import annotations

import torch

_dynamo_counters = None  # torch._dynamo.utils.counters, imported by `prime` (1-3 s: not at the module's import)

_CUDA_KEYS = {"alloc_retries": "num_alloc_retries", "ooms": "num_ooms", "device_allocs": "num_device_alloc",
              "device_frees": "num_device_free"}


def prime() -> None:
    """Import dynamo's counters now (a replica's constructor), so no call pays their first import."""
    global _dynamo_counters
    if _dynamo_counters is None:
        from torch._dynamo.utils import counters
        _dynamo_counters = counters


def snapshot(device: str) -> dict[str, int]:
    """The counters now (CUDA ones only on a CUDA replica)."""
    prime()
    counts = {"compiled_graphs": int(_dynamo_counters["stats"]["unique_graphs"])}
    if device == "cuda" and torch.cuda.is_available():
        stats = torch.cuda.memory_stats()
        counts.update({name: int(stats.get(key, 0)) for name, key in _CUDA_KEYS.items()})
    return counts


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that changed between two snapshots, with their increase."""
    return {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}

