"""TextEncoderDeployment: prompt -> UMT5 embedding [L, text_dim] float32, with an LRU cache.

The cache is per owner (issue 43): an encode is answered from it only when the same owner (the
tag of an API key, else of a client address; deployments/wire.py) encoded that prompt before,
so the time of an encode (`stage_durations.text_encode`, 6-10 ms from the cache against
130-180 ms computed on a CPU) never tells one principal that another used a prompt."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import numpy as np
from ray import serve

from deployments.replicas.compute_thread import ComputeThread
from deployments.config import ModelArgs
from deployments.log import get_log, log_routine_access_at_debug
from deployments.replicas.memory import cap_process, memory_report
from model.factory import load_text_engine
from model.ready import ReadyClock
from model.warmup import WarmupReport, warm_up_text


@serve.deployment
class TextEncoderDeployment:
    """Stateless; one engine per replica, calls serialised (the encoder is not re-entrant)."""

    def __init__(self, model: ModelArgs) -> None:
        log_routine_access_at_debug()
        clock = ReadyClock()
        self._device = model.device
        cap = cap_process(model.device, None) if model.device == "cuda" else None  # its num_gpus share
        self._engine = load_text_engine(model.preset, model.checkpoint, model.dtype, model.device,
                                        random_weights=model.random_weights, int8=model.text_weights == "int8")
        clock.mark("load")
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()  # (owner, prompt) -> embedding
        self._cache_size = model.prompt_cache_size
        self._lock = asyncio.Lock()
        self._thread = ComputeThread("lwf-TextEncoderDeployment")  # per-thread cuBLAS state: compute_thread.py
        self._log = get_log("text_encoder", preset=model.preset)
        # One prompt through the encoder before traffic, on the thread the calls run on; its
        # embedding is not cached.
        report = self._thread.call(warm_up_text, self._engine) if model.warmup else WarmupReport()
        clock.mark("warmup")
        self._info = {"warmup_s": round(report.seconds, 3), "memory_cap_bytes": cap,
                      "random_weights": model.random_weights, "ready": clock.split(report)}
        self._log.info("ready split", fields=self._info["ready"])
        if model.random_weights:
            self._log.warning("RANDOM WEIGHTS: this text encoder is NOT A REAL MODEL (load tests only)")

    async def encode(self, prompt: str, owner: str = "") -> np.ndarray:
        """The prompt's embedding, float32 [L, text_dim] (read-only, possibly shared); cached for
        `owner` only (the tag of the principal asking)."""
        hit = self._cache.get((owner, prompt))
        if hit is not None:
            self._cache.move_to_end((owner, prompt))
            return hit
        async with self._lock:
            tensor = await self._thread.run(self._engine.encode, prompt)
        emb = tensor.numpy()  # CPU float32
        emb.setflags(write=False)
        if self._cache_size:
            self._cache[(owner, prompt)] = emb
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._log.info("encoded prompt", fields={"tokens": emb.shape[0], "chars": len(prompt)})
        return emb

    async def probe(self) -> bool:
        """Reachability probe (deployments/ingress/health.py)."""
        return True

    async def stats(self) -> dict[str, Any]:
        """Health probe (/healthz) and memory report (/v1/models)."""
        return {"cached_prompts": len(self._cache), **memory_report(self._device), **self._info}
