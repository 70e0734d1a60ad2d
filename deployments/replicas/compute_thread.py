"""The one thread a model replica runs its model work on: warm-up, session builds, every call.

PyTorch keeps cuDNN's autotuned convolution plans per thread (`torch.backends.cudnn.benchmark`:
the v8 API's benchmark cache is thread_local, pytorch/pytorch#103939), and likewise per-thread
cuBLAS handles and workspaces. Model calls run on `asyncio.to_thread`'s shared pool moved from
thread to thread as the pool grew (the health check and the warm-up use it too), so a call
that landed on a thread new to a conv shape autotuned it again: on the H200 a 0.27 s VAE
decode ran 1.6-2.2 s, with ~35 cudaMalloc / cudaFree during it (the autotuner's workspaces, its
`emptyCache`), and slowed the DiT sharing the card (served run of 2026-12-02, the `slow call`
lines of benchmarks/results/h200_round2_serve_window_stall_*). One thread per replica keeps the
plans the warm-up made for every later call. The model work is serialised by the replica's
compute lock already, so one thread costs no concurrency.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    """A single worker thread; `run` awaits `fn(*args)` on it."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the thread. A thread cannot be stopped: when the caller is cancelled
        (e.g. its client left), wait for the job to end before returning, so that whoever holds
        the compute lock gives it up only when no job touches the session's tensors."""
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            await asyncio.gather(job, return_exceptions=True)
            raise

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the thread, waited for here (a synchronous constructor's
        warm-up)."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def shutdown(self) -> None:
        """No new jobs; the one running ends on its own."""
        self._pool.shutdown(wait=False)
