"""Lane: a serial FIFO of calls from one connection to one deployment; `ReplicaLanes`: the
handles, lanes, args and log a connection's parts share to reach its replicas.

Every call a connection makes to a deployment goes through that deployment's lane: at most
one in flight, in submission order. The order is fixed when `submit` is called
(synchronously), which is what keeps chunks in order.

Two rules make a lane safe against clients that vanish at any moment:

* **Its own request identity.** Serve gives a call made inside a request the request's
  `internal_request_id`, routes and counts concurrent calls of one id together, and cancels
  them all when the parent request is cancelled (RAY_SERVE_NOTES §4.1). A lane's worker runs
  in a fresh `contextvars.Context`, outside the WebSocket request's context: each of its calls
  gets its own id, and the end of the socket does not reach into calls on their way.
* **Never cancelled mid-call.** A Serve call cancelled while it is being routed or run can
  leave the replica's session half-opened or its request slot taken. `drain` drops the jobs
  that have not started and waits for the running one (bounded); it never cancels it. A job
  still running at the deadline finishes on its own; the lane's worker then ends.
"""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from ray.serve.handle import DeploymentHandle

from deployments.config import AppArgs
from deployments.ingress.guards.claim_gate import ClaimGate
from deployments.log import KeyValueLog

T = TypeVar("T")

Job = Callable[[], Awaitable[Any]]

_STOP = None  # queue sentinel: the worker ends once it reads it


class Lane:
    """Runs submitted jobs one at a time, in the order they were submitted."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._closing = False
        self._queue: asyncio.Queue[Optional[tuple[Job, asyncio.Future]]] = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(
            self._run(), name=f"lane-{name}", context=contextvars.Context())

    @property
    def closing(self) -> bool:
        return self._closing

    def submit(self, job: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """Queue `job`; the future gets its result or exception (cancelled once draining)."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.cancel()
        else:
            self._queue.put_nowait((job, fut))
        return fut

    def close(self) -> None:
        """Take no more jobs and drop the queued ones (their futures are cancelled); the running
        one goes on (never cancelled), then the worker ends."""
        if self._closing:
            return
        self._closing = True
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not _STOP:
                item[1].cancel()
        self._queue.put_nowait(_STOP)

    async def drain(self, timeout_s: float) -> bool:
        """`close`, then wait up to `timeout_s` for the running job. True when the lane is idle."""
        self.close()
        done, _ = await asyncio.wait({self._worker}, timeout=timeout_s)
        return bool(done)

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not _STOP:
            job, fut = item
            if fut.cancelled():
                continue
            try:
                result = await job()
            except asyncio.CancelledError:
                if _cancelling():  # the worker itself is cancelled (event loop shutdown)
                    fut.cancel()
                    raise
                fut.cancel()  # the job awaited something that was cancelled
            except Exception as e:  # noqa: BLE001 - handed to whoever awaits the future
                if not fut.cancelled():
                    fut.set_exception(e)
            else:
                if not fut.cancelled():
                    fut.set_result(result)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass(frozen=True)
class Backends:
    """Handles of the deployments a connection calls."""

    text: DeploymentHandle
    vae: DeploymentHandle
    dit: DeploymentHandle
    parking: Optional[DeploymentHandle] = None  # SessionParking (parking.py); None: sessions end with their socket
    room: Optional[DeploymentHandle] = None  # WaitingRoom (line/room.py); None: `busy` at once when no place is free
    hub: Optional[DeploymentHandle] = None  # WorldHub (sharing/hub.py); None: `share` is refused
    claims: ClaimGate = field(default_factory=ClaimGate)  # failed resume claims, per client (one per ingress replica)


@dataclass(frozen=True, slots=True)
class ReplicaLanes:
    """How one connection's parts reach its sessions' replicas: the deployments' handles, the
    connection's two lanes to them, the app's args and the connection's log. Made once per
    connection (connection.py) and handed to each part that opens, rebuilds or frees sessions
    (releases, branching, prefix reuse, resume, rebuild, the lane jobs)."""

    backends: Backends
    dit_lane: Lane
    vae_lane: Lane
    args: AppArgs
    log: KeyValueLog
    line: Any = None  # the connection's LineSeats (line/seat.py): a yielded session's rebuild waits its turn
