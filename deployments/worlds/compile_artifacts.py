"""A replica's torch.compile artefacts in the world store: a new replica on a fresh node starts warm
(issue 55 item 5).

A DiT or VAE replica compiles its regions at every serving size in its constructor (the H100's
cold start: 197 s to healthy, the VAE's compile of three sizes 142 s of it). The local compile
cache (model/compile_cache.py, `model.compile_cache_dir`) keeps that for the next start on the
same node; this module keeps torch's mega-cache blob (`CompileCache.artifact()`) in the store
(`worlds`, with `worlds.compile_artifacts: true`) so that any node loads it:

- the key is `compile/<digest>/<deployment>.bin`; the digest (sha256, 32 hex digits) is of
  everything that makes an artefact invalid elsewhere: `toolchain` (torch, Triton, CUDA, Python,
  the device's name and capability or the CPU's instruction set), the deployment, the model's
  config (`model`, without the fields no replica compiles from) and the speed transforms
  (`AccelOptions`). Anything else is another key, never a wrong artefact;
- the object is `MAGIC`, the payload's sha256 (64 hex digits), a newline, the payload. A read
  checks the magic, the digest and the size bound (`worlds.compile_artifact_max_mib`; the size is
  listed before the bytes are read) before torch sees a byte;
- `fetch` runs before anything compiles and only where the local cache loaded nothing; `publish`
  runs after the warm-up and puts the replica's blob unless the store's was loaded and nothing
  compiled anew, or (a replica warm from its local cache) the store has one already.

Nothing here fails a start: a store that is down, a missing, oversized, corrupt or unloadable
artefact is logged once (a warning) and counted in `stats()` (the replica's ready split,
`compile_store`), and the replica compiles as it would have without the store. The calls block
(a store's I/O, bounded by `worlds.timeout_s`); the replicas run them on their model thread.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from deployments.config import ModelArgs
from deployments.worlds.backends import open_store
from deployments.worlds.errors import WorldNotFound
from deployments.worlds.store import WorldStore
from deployments.worlds_args import WorldsArgs

if TYPE_CHECKING:
    from model.accel import AccelOptions
    from model.compile_cache import CompileCache

_log = logging.getLogger("deployments.worlds.compile_artifacts")

KEY_ROOT = "compile"
MAGIC = b"LWFCOMPILE1\n"
HEADER_BYTES = len(MAGIC) + 64 + 1  # magic, sha256 hex, newline
MIB = 1024 * 1024
# `model` fields no compiled region depends on: the text encoder's, the ingress's, the cache's place
NOT_COMPILED_FROM = frozenset({"compile_cache_dir", "prompt_cache_size", "text_weights", "warmup",
                               "max_output_area", "max_aspect_ratio"})


def artifact_key(name: str, facts: dict[str, Any]) -> str:
    """The store key of deployment `name`'s artefact built under `facts` (JSON-able)."""
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return f"{KEY_ROOT}/{digest}/{name}.bin"


def artifact_facts(name: str, model: ModelArgs, options: "AccelOptions", parallel: int = 1) -> dict[str, Any]:
    """What deployment `name`'s artefact depends on (see the module docstring)."""
    from model.compile_cache import toolchain

    return {"deployment": name, "parallel": parallel, "toolchain": toolchain(model.device),
            "model": model.model_dump(mode="json", exclude=set(NOT_COMPILED_FROM)),
            "accel": dataclasses.asdict(options)}


def replica_artifacts(store: Optional[WorldsArgs], name: str, model: ModelArgs, options: "AccelOptions",
                      parallel: int = 1) -> Optional["StoreArtifacts"]:
    """A replica's artefacts in the store, or None where `store` keeps none (`compile_artifacts`
    off, or no store given)."""
    if store is None or not store.compile_artifacts:
        return None
    return open_artifacts(store, name, artifact_facts(name, model, options, parallel))


def open_artifacts(args: WorldsArgs, name: str, facts: dict[str, Any]) -> "StoreArtifacts":
    """Deployment `name`'s artefacts in the configured store; a store that cannot be opened (a
    missing client library, a bad endpoint) is logged and counted, never raised."""
    max_bytes = int(args.compile_artifact_max_mib * MIB)
    key = artifact_key(name, facts)
    try:
        store: Optional[WorldStore] = open_store(args)
    except Exception as exc:  # noqa: BLE001 - the artefacts are an optimisation: compile instead
        artifacts = StoreArtifacts(None, key, max_bytes)
        artifacts._failed("open", exc)
        return artifacts
    return StoreArtifacts(store, key, max_bytes)


def frame(payload: bytes) -> bytes:
    """The stored object: magic, the payload's sha256, newline, payload."""
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def unframe(data: bytes) -> bytes:
    """The payload of a stored object; ValueError when it is not one or its digest does not match."""
    if len(data) < HEADER_BYTES or not data.startswith(MAGIC) or data[HEADER_BYTES - 1:HEADER_BYTES] != b"\n":
        raise ValueError("not a compile artefact object")
    payload = data[HEADER_BYTES:]
    if hashlib.sha256(payload).hexdigest().encode() != data[len(MAGIC):HEADER_BYTES - 1]:
        raise ValueError("checksum mismatch")
    return payload


@dataclass
class StoreArtifacts:
    """One replica's use of the store for its compile artefacts (see the module docstring)."""

    store: Optional[WorldStore]  # None: the store could not be opened (counted, compiling as usual)
    key: str
    max_bytes: int
    fetched: str = "not_tried"  # loaded | absent | too_large | bad | unloadable | unavailable | local_cache
    loaded_bytes: int = 0
    fetch_s: float = 0.0
    published: str = "not_tried"  # put | same | present | empty | too_large | unavailable
    put_bytes: int = 0
    put_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    _loaded_digest: Optional[str] = field(default=None, repr=False)

    def _failed(self, what: str, exc: BaseException) -> None:
        _log.warning("compile artefact %s: %s failed (%s); the replica compiles as without the store",
                     self.key, what, exc)
        self.errors.append(f"{what}: {type(exc).__name__}: {exc}")

    def fetch(self, cache: "CompileCache") -> bool:
        """Before anything compiles: load the store's artefact into `cache` where the local cache
        loaded nothing. True when torch loaded it."""
        if cache.loaded_bytes:
            self.fetched = "local_cache"
            return False
        if self.store is None:
            self.fetched = "unavailable"
            return False
        t0 = time.perf_counter()
        try:
            return self._fetch(cache)
        finally:
            self.fetch_s = time.perf_counter() - t0

    def _fetch(self, cache: "CompileCache") -> bool:
        assert self.store is not None
        try:
            listed = [o for o in self.store.list(self.key.rsplit("/", 1)[0]) if o.key == self.key]
            if not listed:
                self.fetched = "absent"
                return False
            if listed[0].size > self.max_bytes + HEADER_BYTES:
                self.fetched = "too_large"
                self._failed("fetch", ValueError(f"{listed[0].size} bytes, over the bound of {self.max_bytes}"))
                return False
            data = self.store.get(self.key)
        except WorldNotFound:  # deleted between the listing and the read
            self.fetched = "absent"
            return False
        except Exception as exc:  # noqa: BLE001 - StoreUnavailable, or any backend's failure
            self.fetched = "unavailable"
            self._failed("fetch", exc)
            return False
        try:
            payload = unframe(data)
        except ValueError as exc:
            self.fetched = "bad"
            self._failed("fetch", exc)
            return False
        if not cache.hot_load(payload, "store"):
            self.fetched = "unloadable"
            self.errors.append("fetch: torch did not load it")
            return False
        self.fetched, self.loaded_bytes = "loaded", len(payload)
        self._loaded_digest = hashlib.sha256(payload).hexdigest()
        return True

    def publish(self, cache: "CompileCache") -> None:
        """After the warm-up: put this replica's artefact (`cache.artifact()`) in the store unless
        the store's was loaded and nothing compiled anew (no inductor cache miss), or the store
        holds one already and this replica was warm from its local cache."""
        if self.store is None:
            self.published = "unavailable"
            return
        if self.fetched == "loaded" and not cache.stats()["fxgraph_cache_miss"]:
            self.published = "same"
            return
        t0 = time.perf_counter()
        try:
            self._publish(cache)
        finally:
            self.put_s = time.perf_counter() - t0

    def _publish(self, cache: "CompileCache") -> None:
        assert self.store is not None
        payload = cache.artifact()
        if not payload:
            self.published = "empty"
            return
        if len(payload) > self.max_bytes:
            self.published = "too_large"
            self._failed("publish", ValueError(f"{len(payload)} bytes, over the bound of {self.max_bytes}"))
            return
        if hashlib.sha256(payload).hexdigest() == self._loaded_digest:
            self.published = "same"
            return
        try:
            if self.fetched == "local_cache" and any(o.key == self.key for o in
                                                     self.store.list(self.key.rsplit("/", 1)[0])):
                self.published = "present"
                return
            self.store.put(self.key, frame(payload))
        except Exception as exc:  # noqa: BLE001 - StoreUnavailable, or any backend's failure
            self.published = "unavailable"
            self._failed("publish", exc)
            return
        self.published, self.put_bytes = "put", len(payload)

    def stats(self) -> dict[str, Any]:
        """What the replica's ready split reports as `compile_store`."""
        return {"key": self.key, "fetched": self.fetched, "loaded_bytes": self.loaded_bytes,
                "fetch_s": round(self.fetch_s, 3), "published": self.published, "put_bytes": self.put_bytes,
                "put_s": round(self.put_s, 3), "errors": list(self.errors)}
