"""SessionHost: what the stateful deployments (CausalDiT, VaeCodec) share.

A replica holds many sessions in a `SessionTable`. Model work runs in a worker thread under
one per-replica lock (`_compute`), so the replica's event loop stays free for health checks,
routing stats and calls of other sessions. A background task expires idle sessions.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, Optional, TypeVar

from ray import serve

from deployments.log import KeyValueLog
from deployments.metrics import SessionMetrics
from deployments.session_table import SessionTable

S = TypeVar("S")
T = TypeVar("T")

SWEEP_PERIOD_MIN_S = 0.25
SWEEP_PERIOD_MAX_S = 10.0


class SessionHost(Generic[S]):
    """Base class of a deployment that keeps per-session state (subclasses call `_start_host`)."""

    def _start_host(self, table: SessionTable[S], release: Callable[[S], None], log: KeyValueLog) -> None:
        """`release(state)` frees one session's memory (called in the worker thread)."""
        self._table = table
        self._release = release
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._log = log.bind(replica=self._replica)
        self._lock = asyncio.Lock()
        self._metrics = SessionMetrics()
        period = min(max(table.idle_ttl_s / 4, SWEEP_PERIOD_MIN_S), SWEEP_PERIOD_MAX_S)
        self._sweeper = asyncio.get_running_loop().create_task(self._expire_forever(period))

    async def _compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Run model work in the worker thread, one job at a time per replica."""
        async with self._lock:
            return await _in_thread(fn, *args)

    async def _compute_on(self, key: str, fn: Callable[..., T], *args: Any,
                          prepare: Optional[Callable[[str, S], None]] = None) -> T:
        """`fn(state, *args)` for session `key` in the worker thread; `SessionLost` when not held.

        `prepare(key, state)` runs first on the event loop (bookkeeping that touches the table).
        """
        with self._table.hold(key):  # a call queued behind other sessions' work never expires
            async with self._lock:
                state = self._table.get(key)  # closed while queued -> SessionLost
                if prepare is not None:
                    prepare(key, state)
                return await _in_thread(fn, state, *args)

    async def close(self, key: str) -> bool:
        """Free a session at once; False when it was not held (closing is idempotent)."""
        async with self._lock:
            state = self._table.pop(key)
            if state is not None:
                await _in_thread(self._release, state)
        self._publish()
        if state is not None:
            self._log.info("session closed", fields={"session": key})
        return state is not None

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by SessionAffinityRouter to place new sessions."""
        return {
            "sessions": len(self._table),
            "capacity": self._table.max_sessions,
            "free_slots": self._table.free_slots,
            "replica": self._replica,
            "keys": self._table.keys(),  # lets a router correct these stale numbers by its own opens/closes
        }

    async def stats(self) -> dict[str, Any]:
        """Health probe and capacity report (/healthz, /v1/models)."""
        stats = self.record_routing_stats()
        del stats["keys"]
        return {**stats, "cache_bytes": self._table.bytes_in_use}

    def _publish(self) -> None:
        self._metrics.update(len(self._table), self._table.bytes_in_use)

    async def _expire_forever(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            async with self._lock:
                expired = self._table.pop_expired()
                for _, state in expired:
                    await _in_thread(self._release, state)
            for key, _ in expired:
                self._metrics.expired.inc()
                self._log.info("session expired (idle)", fields={"session": key, "ttl_s": self._table.idle_ttl_s})
            if expired:
                self._publish()


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread. A thread cannot be stopped: when the caller is cancelled
    (e.g. its client left), wait for the thread to end before giving the lock up, so that no
    other job touches the session's tensors meanwhile."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.gather(job, return_exceptions=True)
        raise
