"""How long a replica took to become ready, split by phase (issue 35: "report the split").

A replica's constructor starts a `ReadyClock`, marks each phase as it ends (`load`: building the
engine and its weights on the device; `warmup`: compiling and running every serving size;
`cache_save`: writing the compile cache; the VAE's `probe` of its cache layout; `store_fetch` /
`store_put`: its compile artefacts read from / put in the world store, where configured) and
reports `split(...)`: the phases' seconds, the warm-up per size with torch.compile's share, the
compile cache's hits and misses (and the store's part, `compile_store`), the total, and
the wall-clock times it started and ended (so that a benchmark can place the replica on the
time line of `serve run`: benchmarks/ready_split.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from model.compile_cache import CompileCache
from model.warmup import WarmupReport


@dataclass
class ReadyClock:
    """Phase times of one replica's start (wall clock)."""

    started_at: float = field(default_factory=time.time)  # Unix time the constructor began
    _t0: float = field(default_factory=time.perf_counter)
    _last: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> float:
        """End `phase` now; its seconds (from the previous mark, or the start)."""
        now = time.perf_counter() - self._t0
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now
        return self.phases[phase]

    def split(self, warmup: WarmupReport, cache: Optional[CompileCache] = None,
              store: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """The replica's ready split (what `stats()` reports as `ready` and the log line says)."""
        total = time.perf_counter() - self._t0
        out: dict[str, Any] = {
            "started_at": round(self.started_at, 3), "ready_at": round(self.started_at + total, 3),
            "total_s": round(total, 3), **{f"{k}_s": round(v, 3) for k, v in self.phases.items()},
            "compile_s": round(sum(warmup.compile_seconds), 3), "warmup_per_size": warmup.per_size(),
        }
        if cache is not None:
            out["compile_cache"] = cache.stats()
        if store is not None:
            out["compile_store"] = store
        return out
