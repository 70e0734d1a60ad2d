"""Memory of a replica on a shared device: its cap, the DiT's session budget, its report.

Several deployments share one GPU (serve_config.gpu.yaml: DiT, VAE and T5 on one card), each
with a fractional `num_gpus`. Ray's fractions are bookkeeping only, so each replica caps its
own process at its share (`torch.cuda.set_per_process_memory_fraction`): one that overreaches
fails alone instead of starving its neighbours. The DiT's session budget is then what its cap
leaves after its weights and warm-up, never "free memory at start" (which on a shared card
depends on who loaded first).
"""
from __future__ import annotations

import gc
import logging
import os
import resource
from typing import Any, Optional

import torch
from torch import nn

CPU_MEMORY_FRACTION = 0.25  # of the RAM, for a CPU DiT replica without sessions.memory_fraction
# Of the cap, kept free for allocator fragmentation and library workspaces. benchmarks/capacity.py
# (H200, every card share): admission's footprint matched the measured peaks within 0.1 GiB, and
# the session refused by 20 MiB at 5 % on an 80 GB card's 0.75 share ran at 56.4 of its 59.4 GiB.
SLACK_SHARE = 0.04
GIB = 1024**3
CARD_BYTES_ENV = "LWF_CARD_BYTES"

_log = logging.getLogger("ray.serve.lwf.memory")


def gpu_share() -> Optional[float]:
    """The GPUs Ray assigned to this actor (a replica's `num_gpus`); None outside Ray."""
    try:
        import ray

        share = ray.get_runtime_context().get_assigned_resources().get("GPU")
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return None
    return float(share) if share else None


def device_total_bytes(device: str) -> int:
    """Memory of the serving device: the GPU's, or the machine's RAM. `LWF_CARD_BYTES` (benchmarks
    only) makes a larger card stand for a smaller one: the shares and caps are taken of that many
    bytes (an 80 GB H100's 85.03e9 on an H200: its configs measured where no H100 is lent)."""
    if device == "cuda":
        real = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return min(real, int(os.environ.get(CARD_BYTES_ENV, real)))
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cap_process(device: str, fraction: Optional[float]) -> int:
    """Cap this process at `fraction` of the device (CUDA: enforced by torch's allocator; CPU:
    an accounting figure only); returns the cap in bytes. `fraction` None: the replica's GPU
    share (Ray's assigned `num_gpus`), else no cap (the whole device)."""
    if fraction is None:
        fraction = gpu_share() if device == "cuda" else CPU_MEMORY_FRACTION
    if fraction is None or fraction <= 0:
        _log.warning("no GPU share assigned (num_gpus 0?): the process is not capped")
        fraction = 1.0
    fraction = min(fraction, 1.0)
    cap = int(fraction * device_total_bytes(device))
    if device == "cuda":  # torch's fraction is of the real card (smaller under LWF_CARD_BYTES)
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(
            torch.cuda.current_device()).total_memory)
    return cap


def resident_model_bytes(device: str, module: nn.Module) -> int:
    """What the process holds after loading and warming up: CUDA's allocated bytes, or on the
    CPU the module's parameters and buffers (views counted once)."""
    gc.collect()  # warm-up sessions are gone before this counts what stays
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def session_budget(explicit_gib: Optional[float], cap_bytes: int, resident_bytes: int) -> int:
    """The DiT replica's budget for its sessions: `explicit_gib`, else the cap minus what is
    resident minus SLACK_SHARE of the cap (at least 0)."""
    if explicit_gib is not None:
        return int(explicit_gib * GIB)
    return max(0, cap_bytes - resident_bytes - int(SLACK_SHARE * cap_bytes))


def memory_report(device: str) -> dict[str, Any]:
    """Peak and current memory of this process (replica stats, the serving benchmark)."""
    if device == "cuda":
        return {"peak_memory_bytes": torch.cuda.max_memory_allocated(),
                "memory_allocated_bytes": torch.cuda.memory_allocated(),
                "memory_reserved_bytes": torch.cuda.memory_reserved(), "peak_memory_kind": "cuda_allocated"}
    return {"peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_memory_kind": "rss"}
