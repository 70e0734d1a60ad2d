"""SessionHost: what the stateful deployments (DiTDeployment, VaeDeployment) share.

A replica holds many sessions in a `SessionTable`. Model work runs in a worker thread under
one per-replica lock (`_compute`), so the replica's event loop stays free for health checks,
routing stats and calls of other sessions. Closes take that lock ahead of queued chunks
(deployments/replicas/priority_lock.py): a reset is answered after the job running, not after every
session's queued work. A session's calls take it as its class: a live session's before an
offline one's (a `/v1/videos` job's), round robin per call among the sessions of a class
(issue 46). A background task expires idle sessions.
`check_health` (Serve's health check) runs a tiny op on the serving device: a replica whose
GPU is unusable fails it and Serve replaces the replica (its sessions are then rebuilt
elsewhere by the ingress, see journal.py).
"""
from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, Optional, TypeVar

import torch
from ray import serve

from deployments.replicas import stall_counters
from deployments.autoscaling_policy import LOAD, REFUSED, replica_load
from deployments.replicas.compute_thread import ComputeThread
from deployments.errors import Busy, NoSnapshot, SessionLost
from deployments.log import KeyValueLog, log_routine_access_at_debug, log_typed_errors_as_info
from deployments.replicas.memory import memory_report
from deployments.metrics import SessionMetrics
from deployments.replicas.priority_lock import LIVE, OFFLINE, PriorityLock
from deployments.replicas.session_table import SessionTable
from deployments.replicas.snapshots import SnapshotShelf
from deployments.replicas.call_summary import CallSummary
from deployments.replicas.slow_calls import SlowCalls

S = TypeVar("S")
T = TypeVar("T")

SWEEP_PERIOD_MIN_S = 0.25
SWEEP_PERIOD_MAX_S = 10.0


class SessionHost(Generic[S]):
    """Base class of a deployment that keeps per-session state (subclasses call `_start_host`)."""

    slow_call_s = 2.0  # a model call that runs this long counts in the `slow calls` summary line
    _metrics: Optional[SessionMetrics] = None

    def _start_host(self, table: SessionTable[S], release: Callable[[S], None], log: KeyValueLog,
                    device: str, snapshot_bytes: int = 0) -> None:
        """`release(state)` frees one session's memory (called in the worker thread);
        `snapshot_bytes`: the most the replica's snapshots may hold (snapshots.py; 0: none)."""
        log_typed_errors_as_info()
        log_routine_access_at_debug()
        stall_counters.prime()  # here, not at import (the app's build imports this module too)
        self._table = table
        table.snapshots = SnapshotShelf(snapshot_bytes)
        self._loop = asyncio.get_running_loop()
        self._device = device
        self._release = release
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._log = log.bind(replica=self._replica)
        self._lock = PriorityLock()
        self._jobs: set[asyncio.Future] = set()  # compute jobs that outlive their caller (`_compute_on_early`)
        self._metrics = SessionMetrics()
        self._expired_total = 0  # sessions freed by the idle TTL (not by a close)
        self._refused_total = 0  # new sessions admission answered busy (drives autoscaling)
        period = min(max(table.idle_ttl_s / 4, SWEEP_PERIOD_MIN_S), SWEEP_PERIOD_MAX_S)
        self._sweeper = asyncio.get_running_loop().create_task(self._expire_forever(period))

    @property
    def compute_thread(self) -> ComputeThread:
        """The replica's one model thread (deployments/replicas/compute_thread.py says why one); the
        deployments run their warm-up on it before `_start_host`."""
        thread = self.__dict__.get("_compute_thread")
        if thread is None:
            thread = self._compute_thread = ComputeThread(f"lwf-{type(self).__name__}")
        return thread

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the model thread (callers hold the compute lock)."""
        return await self.compute_thread.run(fn, *args)

    async def _compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Run model work in the worker thread, one job at a time per replica."""
        async with self._lock:
            return await self._run(fn, *args)

    async def _compute_on(self, routing_key: str, fn: Callable[..., T], *args: Any,
                          prepare: Optional[Callable[[str, S], None]] = None) -> T:
        """`fn(state, *args)` for session `routing_key` in the worker thread; `SessionLost` when not held.

        `prepare(routing_key, state)` runs first on the event loop (bookkeeping that touches the table).
        """
        with self._table.hold(routing_key):  # a call queued behind other sessions' work never expires
            queued = time.perf_counter()
            async with self._turn(routing_key):
                state = self._table.get(routing_key)  # closed while queued -> SessionLost
                if prepare is not None:
                    prepare(routing_key, state)
                counters = stall_counters.snapshot(self._device)
                started = time.perf_counter()
                try:
                    return await self._run(fn, state, *args)
                finally:
                    ran_s = time.perf_counter() - started
                    self._record_call(routing_key, fn, started - queued, ran_s,
                                      lambda: stall_counters.moved(counters, stall_counters.snapshot(self._device)))

    def _turn(self, routing_key: str):
        """`async with self._turn(key):` the compute lock for a call of session `key`: in its
        class (live before offline), round robin among the sessions of that class."""
        return self._lock.hold(OFFLINE if self._table.is_offline(routing_key) else LIVE, routing_key)

    def _count_call(self, name: str) -> None:
        """One more of `name` in `stats()["calls"]` (model calls run, by name)."""
        calls = self.__dict__.setdefault("_calls_total", {})
        calls[name] = calls.get(name, 0) + 1

    def _record_call(self, routing_key: str, fn: Callable[..., Any], waited_s: float, ran_s: float,
                     counters_moved: Callable[[], dict[str, int]] = dict) -> None:
        """Per-call wait and run times: Prometheus histograms, and a slow call counted in the
        replica's `slow calls` summary line (deployments/replicas/slow_calls.py: a stall inside the
        replica shows as a long run; a long wait is other sessions' work) with the process
        counters that moved during it (`stall_counters`: a compile, the allocator's retries,
        cudaMalloc / cudaFree)."""
        call = getattr(fn, "__name__", "call").lstrip("_")
        self._count_call(call)
        self.call_summary.add(routing_key, call, ran_s)
        if self._metrics is not None:
            self._metrics.observe_call(call, waited_s, ran_s)
        if ran_s >= self.slow_call_s:
            self.slow_calls.add(routing_key, call, waited_s, ran_s, counters_moved())

    @functools.cached_property
    def call_summary(self) -> CallSummary:
        """The replica's `calls` line per interval (made on first use, with the replica's log)."""
        return CallSummary(self._log)

    @functools.cached_property
    def slow_calls(self) -> SlowCalls:
        """The replica's slow-call summary (made on first use, with the replica's log)."""
        return SlowCalls(self._log)

    async def _compute_on_early(self, routing_key: str, fn: Callable[..., T], *args: Any,
                                prepare: Optional[Callable[[str, S], None]] = None) -> T:
        """As `_compute_on`, for `fn(state, publish, *args)` that calls `publish(result)` before
        it is done: the result is returned then, while the rest of `fn` (its follow-up work on
        the same session) runs on, still holding the lock. The job is never cancelled with its
        caller. `fn` failing after publishing closes the session (its next call: SessionLost)."""
        loop = asyncio.get_running_loop()
        early: asyncio.Future = loop.create_future()

        def publish(value: Any) -> None:
            loop.call_soon_threadsafe(lambda: early.done() or early.set_result(value))

        job = asyncio.ensure_future(self._compute_on(routing_key, fn, publish, *args, prepare=prepare))
        self._jobs.add(job)
        job.add_done_callback(lambda j: self._job_done(routing_key, j, early))
        await asyncio.wait({early, job}, return_when=asyncio.FIRST_COMPLETED)
        if early.done():
            return early.result()
        return job.result()  # it ended without publishing: its result or its error

    def _job_done(self, routing_key: str, job: asyncio.Future, early: asyncio.Future) -> None:
        self._jobs.discard(job)
        if job.cancelled() or job.exception() is None or not early.done():
            return  # a failure before publishing reached the caller
        self._log.error("follow-up work failed; session dropped", fields={
            "session": routing_key, "error": f"{type(job.exception()).__name__}: {job.exception()}"})
        closing = asyncio.ensure_future(self.close(routing_key))
        self._jobs.add(closing)
        closing.add_done_callback(self._jobs.discard)

    def _reserve_slot(self, routing_key: str, nbytes: int, working: int = 0, reserve_only: bool = False,
                      offline: bool = False, bucket: Optional[Hashable] = None, gated: bool = True) -> None:
        """Admit `routing_key` (`Busy` when full, `TooLarge` when it never fits); `reserve_only`: ahead
        of its open, before any work is done for it (the open claims it). `offline`, `bucket`: its
        class and step-time bucket (session_table.py); `gated`: `_admission_gate` has its say (a
        session new to the server; not one rebuilt after its replica's loss)."""
        try:
            if gated:
                self._admission_gate(offline, bucket)
            self._table.admit(routing_key, nbytes, working, reserve_only=reserve_only, offline=offline, bucket=bucket)
        except Busy:
            self._refused_total += 1
            raise

    def _admission_gate(self, offline: bool, bucket: Optional[Hashable]) -> None:
        """Raise `Busy` to refuse a new session beyond the slots and bytes (none here; the DiT's
        frame-rate floor)."""

    async def _open_slot(self, routing_key: str, nbytes: int, build: Callable[[], S], working: int = 0,
                         offline: bool = False, bucket: Optional[Hashable] = None, gated: bool = True) -> S:
        """Admit `routing_key` (or take its reservation), build its state in the worker thread, hold it
        (`offline`, `bucket`, `gated`: as `_reserve_slot`'s)."""
        if not self._table.claim(routing_key):
            self._reserve_slot(routing_key, nbytes, working, offline=offline, bucket=bucket, gated=gated)
        try:
            async with self._turn(routing_key):
                if not self._table.start_building(routing_key):  # closed while it waited for its turn
                    raise SessionLost("the session was closed before it was opened; start a new one")
                state = await self._run(build)
        except BaseException:
            self._table.pop(routing_key)
            raise
        if not self._table.add(routing_key, state):  # closed meanwhile: nobody will close it again
            async with self._lock.urgent():
                await self._run(self._release, state)
            self._publish()
            self._log.info("session closed while opening; freed", fields={"session": routing_key})
            raise SessionLost("the session was closed while it was being opened; start a new one")
        self._publish()
        return state

    async def _replay_in_turns(self, routing_key: str, steps: Sequence[tuple[Callable[..., Any], tuple]]) -> None:
        """Rebuild the session `routing_key`, opened just now, by `steps` in order: `fn(state,
        *args)` each, one past chunk, each its own compute job (issue 43): the calls of other
        sessions queued meanwhile run between two of them, so a replay of k chunks delays another
        session's chunk by about one replayed chunk, not by all k. The session is held (it cannot
        expire) meanwhile; `SessionLost` when it is closed meanwhile; a failure closes it without
        keeping its state as a snapshot (half rebuilt: it must not serve)."""
        try:
            with self._table.hold(routing_key):
                for fn, args in steps:
                    await self._compute_on(routing_key, fn, *args)
        except BaseException:
            await self._close(routing_key, keep=False)
            raise

    @property
    def snapshots(self) -> SnapshotShelf:
        return self._table.snapshots

    def _snapshot(self, routing_key: str, chunks: int, nbytes: int, copy: Callable[[], Any], part: str = "") -> bool:
        """(In the model thread, before a session's call changes its state.) Keep `copy()` as the
        session's state after `chunks` chunks, unless it is kept already or `chunks` is 0 (an
        open is as good), when the shelf and the budget's spare bytes have room for `nbytes`
        (older snapshots evicted for it; booked on the event loop before anything is copied).
        False when it was not taken."""
        shelf = self.snapshots
        if chunks <= 0 or not shelf.fits(nbytes):
            return False
        booked = asyncio.run_coroutine_threadsafe(self._book_snapshot(routing_key, chunks, nbytes, part), self._loop)
        if not booked.result():
            return False
        try:
            with torch.inference_mode():  # the states' tensors are inference tensors
                value = copy()
        except Exception as e:  # out of memory despite the booking: the session goes on without it
            self._loop.call_soon_threadsafe(shelf.cancel, routing_key, chunks, part)
            self._log.warning("snapshot not taken", fields={"session": routing_key, "chunks": chunks,
                                                            "error": f"{type(e).__name__}: {e}"[:200]})
            return False
        # Filled before this job's end reaches the loop: a call queued behind it finds it.
        self._loop.call_soon_threadsafe(shelf.fill, routing_key, chunks, value, part)
        return True

    async def _book_snapshot(self, routing_key: str, chunks: int, nbytes: int, part: str) -> bool:
        if (routing_key not in self._table or self.snapshots.has(routing_key, chunks, part)
                or not self._table.room_for_snapshot(nbytes)):
            return False
        booked = self.snapshots.book(routing_key, chunks, nbytes, part)
        self._publish()
        return booked

    def _final_snapshots(self, state: S) -> list[tuple[int, str, Any, int]]:
        """What a closed session leaves as snapshots: (chunks, part, value, nbytes) each, its
        state itself, not a copy (subclasses; none by default)."""
        return []

    def _keep_closed(self, routing_key: str, state: S, nbytes: int) -> bool:
        """(Event loop, under the compute lock.) A closed session's final state moved to the
        shelf (its bytes stop counting as the session's first); False: release it as usual."""
        if not self.snapshots.enabled:
            return False
        parts = [p for p in self._final_snapshots(state) if p[0] > 0]
        if not parts:
            return False
        self._table.released(nbytes)
        for chunks, part, value, size in parts:
            if not self.snapshots.has(routing_key, chunks, part) and self._table.room_for_snapshot(size):
                self.snapshots.put(routing_key, chunks, value, size, part)
        return True  # what did not fit is dropped with its last reference

    async def _shelved(self, routing_key: str, chunks: int, part: str = "") -> Any:
        """The snapshot of `routing_key` after `chunks` chunks, once the job running now (which
        may be taking it) is done; `NoSnapshot` when this replica keeps none."""
        if self.snapshots.enabled:
            async with self._lock:
                pass
        value = self.snapshots.get(routing_key, chunks, part)
        if value is None:
            raise NoSnapshot(f"this replica keeps no snapshot of the session after {chunks} chunks")
        return value

    async def close(self, routing_key: str) -> bool:
        """End a session; False when it was not held (closing is idempotent).

        Its slot is free at once, so that a router that saw this close routed can place the
        next session here; its memory is freed (and its bytes stop counting) once the call
        that may be running for it has ended.
        """
        return await self._close(routing_key)

    async def _close(self, routing_key: str, keep: bool = True) -> bool:
        """`close`; `keep` False: its final state is freed, never kept as a snapshot."""
        retired = self._table.retire(routing_key)
        if retired is not None:
            state, nbytes = retired
            kept = False
            try:
                async with self._lock.urgent():  # ahead of other sessions' queued chunks
                    kept = keep and self._keep_closed(routing_key, state, nbytes)  # its final state, as a snapshot
                    if not kept:
                        await self._run(self._release, state)
            finally:
                if not kept:
                    self._table.released(nbytes)
            self._log.info("session closed", fields={"session": routing_key})
        self._publish()
        return retired is not None

    async def expect_release(self, routing_key: str, within_s: float) -> bool:
        """The session's holder will close it within `within_s` unless it is used again (the
        parking, for its grace period): `busy` answers count with it (`SessionTable.retry_hint`)."""
        return self._table.expect_release(routing_key, within_s)

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by SessionAffinityRouter to place new sessions."""
        return {
            "sessions": len(self._table),
            "capacity": self._table.max_sessions,
            "free_slots": self._table.free_slots,
            "replica": self._replica,
            "keys": self._table.keys(),  # lets a router correct these stale numbers by its own opens/closes
            # offline sessions bounded apart (max_offline_sessions; None: they take live slots): router.py
            "offline_capacity": self._table.max_offline_sessions,
            "apart": self._table.apart_keys(),
            "snapshots": self.snapshots.ids(),  # where a clone from a snapshot id goes (router.py)
        }

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Read by Serve's autoscaler when the deployment has an `autoscaling_config`
        (HeldSessionsPolicy): held sessions, not requests, keep a replica busy."""
        t = self._table
        return {LOAD: replica_load(len(t), t.max_sessions, t.reserved_bytes, t.budget_bytes),
                REFUSED: float(self._refused_total), "sessions": float(len(t))}

    async def probe(self) -> bool:
        """Reachability probe (deployments/ingress/health.py): answered on the event loop, never behind
        the compute lock, so that it measures the path and not the work queued on it."""
        return True

    async def stats(self) -> dict[str, Any]:
        """Health probe and capacity report (/healthz, /v1/models)."""
        stats = self.record_routing_stats()
        for listing in ("keys", "apart"):
            del stats[listing]
        shelf = self.snapshots
        snapshots = {"held": len(shelf.ids()), "parts": len(shelf), "bytes": shelf.nbytes,
                     "max_bytes": shelf.max_bytes, "taken": shelf.taken, "evicted": shelf.evictions}
        return {**stats, "cache_bytes": self._table.bytes_in_use, "reserved_bytes": self._table.reserved_bytes,
                "snapshots": snapshots,
                "budget_bytes": self._table.budget_bytes, "rss_bytes": resident_bytes(), "expired": self._expired_total,
                "calls": dict(self.__dict__.get("_calls_total", {})), **memory_report(self._device), **getattr(self, "_replica_info", {})}

    async def check_health(self) -> None:
        """Serve's periodic health check: raises when the serving device cannot compute."""
        await asyncio.to_thread(device_probe, self._device)

    def _publish(self) -> None:
        self._metrics.update(len(self._table), self._table.bytes_in_use, self.snapshots.nbytes,
                             self._table.held_by_class())

    async def _expire_forever(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.slow_calls.flush()  # the last slow calls of a replica that went quiet
            self.call_summary.flush()  # and its last calls
            async with self._lock.urgent():
                expired = self._table.pop_expired()
                for _, state in expired:
                    if state is not None:  # None: a reservation whose open never came
                        await self._run(self._release, state)
            self._expired_total += len(expired)
            for routing_key, _ in expired:
                self._metrics.expired.inc()
                self._log.info("session expired (idle)",
                               fields={"session": routing_key, "ttl_s": self._table.idle_ttl_s})
            if expired:
                self._publish()


def device_probe(device: str) -> None:
    """A tiny op on `device`, waited for: raises when a GPU is unusable (a sticky CUDA error,
    a lost device); hangs when it is stuck, which Serve's health-check timeout catches."""
    if device != "cuda":
        return
    x = torch.ones(8, device=device)
    if float((x * 2).sum()) != 16.0:  # float() synchronises
        raise RuntimeError("the GPU returned a wrong result for a tiny op")


def resident_bytes() -> int:
    """Resident memory of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

