"""A compile cache that outlives the process: what one start compiles, the next one loads.

A replica compiles its regions (`torch.compile`: dynamo, AOTAutograd, inductor, Triton) at every
serving size in its constructor; on an H200 that took the DiT 30 s and the VAE 91 s of a 143 s
start (issue 35). `CompileCache.open(directory, name)`, called before anything compiles, points
this process's caches at a directory the config names (`model.compile_cache_dir`; the k8s
manifests mount a volume there):

  <directory>/inductor/   TORCHINDUCTOR_CACHE_DIR: inductor's FX-graph and AOTAutograd caches,
                          its autotuning results and the Triton kernels it generates
  <directory>/triton/     TRITON_CACHE_DIR: every Triton binary, the project's own kernels too
  <directory>/mega/<name>.bin
                          `torch.compiler.save_cache_artifacts()` of the last start (the
                          "mega-cache": the same artefacts in one file), hot-loaded here

`save()` after warm-up writes the mega-cache file (atomically: replicas of one deployment may
share the directory); `stats()` reports what the process's compilations found in the caches
(inductor's FX-graph hits and misses, AOTAutograd's, and the seconds dynamo spent compiling).
Dynamo still traces each region in a new process; only code generation and kernel builds are
saved. A directory that cannot be created leaves torch's defaults (a warning, no failure).

`hot_load(data, source)` loads artefacts that came from elsewhere (the world store's copy,
deployments/worlds/compile_artifacts.py) before anything compiles; `artifact()` is what `save()`
wrote (or, without a directory, what this process would write): the bytes another node loads.
`toolchain(device)` names what an artefact was built by and for (torch, Triton, CUDA, the device
and its capability, the CPU's instruction set): an artefact is only valid where all of it matches.
"""
from __future__ import annotations

import logging
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

_log = logging.getLogger("model.compile_cache")

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
# torch._dynamo.utils.counters entries reported by `stats` (group, key)
COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
            ("inductor", "fxgraph_cache_bypass"), ("aot_autograd", "autograd_cache_hit"),
            ("aot_autograd", "autograd_cache_miss"))
COMPILE_METRIC = "_compile.compile_inner"  # dynamo's timing of one frame's whole compilation


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile so far (dynamo's own timing)."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get(COMPILE_METRIC, [])))


def cache_counters() -> dict[str, int]:
    """Cache hits and misses of this process's compilations (`COUNTERS`)."""
    from torch._dynamo.utils import counters

    return {key: int(counters[group][key]) for group, key in COUNTERS}


def toolchain(device: str) -> dict[str, Any]:
    """What a compile artefact depends on besides the model: the versions that generate and build
    code, and the device it was built for (a GPU's name and compute capability; on the CPU the
    instruction set inductor's C++ code is compiled for)."""
    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = None
    facts: dict[str, Any] = {"torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda,
                             "python": f"{sys.version_info[0]}.{sys.version_info[1]}", "machine": platform.machine(),
                             "device": torch.device(device).type}
    if facts["device"] == "cuda":
        index = torch.device(device).index or 0
        facts["gpu"] = torch.cuda.get_device_name(index)
        facts["capability"] = list(torch.cuda.get_device_capability(index))
    else:
        facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return facts


@dataclass
class CompileCache:
    """The compile cache of one process (see the module docstring); `directory` None: torch's
    defaults, nothing saved."""

    directory: Optional[Path]
    name: str
    loaded_bytes: int = 0  # of the mega-cache file hot-loaded at open
    load_s: float = 0.0
    saved_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    hot_loaded: dict[str, int] = field(default_factory=dict)  # source -> bytes loaded by `hot_load`
    _artifact: Optional[bytes] = field(default=None, repr=False)  # what `save` wrote

    @property
    def mega_file(self) -> Optional[Path]:
        return None if self.directory is None else self.directory / "mega" / f"{self.name}.bin"

    @classmethod
    def open(cls, directory: Optional[str | Path], name: str) -> "CompileCache":
        """Point this process's compile caches at `directory` and hot-load `name`'s mega-cache.
        Call it before the first compilation (a replica's constructor, before loading)."""
        if directory is None:
            return cls(None, name)
        root = Path(directory).expanduser().resolve()
        try:
            for sub in ("inductor", "triton", "mega"):
                (root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _log.warning("compile cache %s unusable (%s): torch's default caches instead", root, exc)
            return cls(None, name, errors=[f"{type(exc).__name__}: {exc}"])
        os.environ[INDUCTOR_ENV] = str(root / "inductor")
        os.environ[TRITON_ENV] = str(root / "triton")
        cache = cls(root, name)
        cache._load()
        return cache

    def _load(self) -> None:
        path = self.mega_file
        if path is None or not path.is_file() or not hasattr(torch.compiler, "load_cache_artifacts"):
            return
        t0 = time.perf_counter()
        try:
            data = path.read_bytes()
            _load_artifacts(data)
        except Exception as exc:  # noqa: BLE001 - a stale or torn file: compile as if cold
            _log.warning("mega-cache %s not loaded (%s): compiling cold", path, exc)
            self.errors.append(f"load: {type(exc).__name__}: {exc}")
            return
        self.loaded_bytes = len(data)
        self.load_s = time.perf_counter() - t0

    def hot_load(self, data: bytes, source: str) -> bool:
        """Load compile artefacts from `source` (e.g. "store") into this process's caches, before
        anything compiles. False (logged, in `errors`) when torch cannot load them: the caller
        compiles as if cold."""
        if not hasattr(torch.compiler, "load_cache_artifacts"):
            return False
        t0 = time.perf_counter()
        try:
            _load_artifacts(data)
        except Exception as exc:  # noqa: BLE001 - bytes from elsewhere: compile cold rather than fail
            _log.warning("compile artefacts from %s not loaded (%s): compiling cold", source, exc)
            self.errors.append(f"{source}: {type(exc).__name__}: {exc}")
            return False
        self.hot_loaded[source] = len(data)
        self.load_s += time.perf_counter() - t0
        return True

    def artifact(self) -> bytes:
        """This process's compile artefacts as one blob: what `save` wrote, else torch's
        `save_cache_artifacts()` now (b"" when there is nothing or torch cannot)."""
        if self._artifact is None:
            try:
                artifacts = torch.compiler.save_cache_artifacts()
            except Exception as exc:  # noqa: BLE001 - the cache is an optimisation
                self.errors.append(f"save: {type(exc).__name__}: {exc}")
                return b""
            self._artifact = bytes(artifacts[0]) if artifacts and artifacts[0] else b""
        return self._artifact

    def save(self) -> int:
        """Write this process's compile artefacts to the mega-cache file (atomically); their
        bytes (0: nothing to save, no directory, or a failure, logged)."""
        path = self.mega_file
        if path is None or not hasattr(torch.compiler, "save_cache_artifacts"):
            return 0
        try:
            artifacts = torch.compiler.save_cache_artifacts()
            if not artifacts or not artifacts[0]:
                return 0
            self._artifact = bytes(artifacts[0])
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(artifacts[0])
            tmp.replace(path)
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: serve anyway
            _log.warning("mega-cache %s not saved (%s)", path, exc)
            self.errors.append(f"save: {type(exc).__name__}: {exc}")
            return 0
        self.saved_bytes = len(artifacts[0])
        return self.saved_bytes

    def stats(self) -> dict[str, Any]:
        """What the replica reports (its ready split's `compile_cache`)."""
        return {"dir": None if self.directory is None else str(self.directory),
                "mega_loaded_bytes": self.loaded_bytes, "mega_load_s": round(self.load_s, 3),
                "mega_saved_bytes": self.saved_bytes, "hot_loaded_bytes": dict(self.hot_loaded), **cache_counters(),
                "errors": list(self.errors)}


def _load_artifacts(data: bytes) -> None:
    """torch's hot load of a mega-cache blob; raises when torch cannot deserialize it."""
    if torch.compiler.load_cache_artifacts(data) is None:
        raise ValueError(f"{len(data)} bytes that are not torch compile artefacts")
