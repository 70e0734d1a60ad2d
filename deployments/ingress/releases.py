"""The session releases of a `Connection` (connection.py): after a reset, a replacement, a
failure, and at the end of the socket, whichever way it ends.

During the connection, a stream's closes are queued on its lanes behind its own calls. At the
end (`teardown`, run detached from the request: see detached.py) nothing is cancelled: the
work not started is dropped, the sessions whose open was answered are closed at once (a
replica frees a session's slot at once and its memory when the call running for it ends; it
refuses an open that arrives after the close, and frees a session closed while being opened),
the calls in flight finish (see lanes.py), and the rest is closed then. `Releases` holds every
stream of its connection whose replicas may still hold state, the keys of their past
incarnations whose close is not answered yet (a rewind's old keys: `retire`), and counts
sessions against the API key's quota from `adopt` to their end.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Optional

from ray.serve.handle import DeploymentHandle

from deployments.ingress.detached import detach, settle
from deployments.ingress.lanes import ReplicaLanes
from deployments.metrics import IngressMetrics
from deployments.ingress.guards.quotas import KeyQuota
from deployments.ingress.stream import Stream, StreamState

EXPECT_RELEASE_CALL_S = 10.0  # telling a replica when a parked session ends is given up after this
PARKING_CLOSE_MARGIN_S = 1.0  # after its grace, a parked session's close: the parking's sweep (0.5 s) and call


class Releases:
    """Frees streams on the replicas."""

    def __init__(self, replicas: ReplicaLanes, quota: Optional[KeyQuota], metrics: IngressMetrics,
                 ended: Callable[[Stream], None] = lambda stream: None) -> None:
        """`ended(stream)`: told when a stream ends here (its seat in the waiting room is freed)."""
        self._b = replicas.backends
        self._dit_lane = replicas.dit_lane
        self._vae_lane = replicas.vae_lane
        self._args = replicas.args
        self._quota = quota
        self._metrics = metrics
        self._on_end = ended
        self._log = replicas.log
        self._held: dict[str, Stream] = {}  # every stream whose replicas may still hold state
        # keys of past incarnations of live streams (a rewind's old keys), tagged "dit:<key>" /
        # "vae:<key>", until their close is answered: the socket's end closes what is left here
        self._retired: set[str] = set()
        self._background: set[asyncio.Task] = set()  # releases

    def adopt(self, stream: Stream, replacing: Optional[Stream]) -> None:
        """`stream` becomes its connection's session in place of `replacing` (closed now, if it
        was not): counted against the quota (which may refuse it: busy), then held."""
        open_now = replacing is not None and replacing.state is StreamState.OPEN
        if self._quota is not None:
            self._quota.start_session(stream.key, replacing=replacing.key if open_now else None)
        if replacing is not None and replacing.state is not StreamState.CLOSED:
            self.close(replacing)
        self._held[stream.key] = stream

    def fail(self, stream: Stream) -> None:
        if stream.fail():
            self._ended(stream)
            stream.released_by(self._release_later(stream))

    def close(self, stream: Stream) -> Optional[asyncio.Task]:
        """Close a stream; its release task (started now if it was open)."""
        if stream.close():
            self._ended(stream)
            stream.released_by(self._release_later(stream))
        return stream.release

    def retire(self, dit_key: str, vae_key: str) -> None:
        """A stream's incarnation under these keys ended while the stream goes on (a rewind made
        it again under new keys): each key is closed on its lane, behind the stream's calls, and
        kept in the ledger until that close is answered. The socket's end (`teardown`) drops the
        jobs still queued, so it closes what the ledger holds then (issue 43: such a close was
        dropped and the old incarnation held a slot until the idle TTL)."""
        for lane, handle, key in ((self._dit_lane, self._b.dit, dit_key), (self._vae_lane, self._b.vae, vae_key)):
            tag = f"{lane.name}:{key}"
            self._retired.add(tag)
            closed = lane.submit(lambda handle=handle, key=key: handle.options(session_id=key).close.remote(key))
            closed.add_done_callback(lambda f, tag=tag: self._retired.discard(tag)
                                     if not f.cancelled() and f.exception() is None else None)

    def _ended(self, stream: Stream) -> None:
        self._on_end(stream)
        if self._quota is not None:
            self._quota.end_session(stream.key)

    def _release_later(self, stream: Stream) -> asyncio.Task:
        """Free the stream on both replicas, each close queued on its lane behind the stream's
        own calls and, where possible, before the open of any session started after it (which
        then never finds the replica full of its own predecessor). Every DiT call of the stream
        is queued already (steps are queued at infer time): its close goes now. VAE decodes are
        queued as steps finish: its close goes now when no chunk is in flight, else after them.
        A stream the prefix store served so far (never materialised) has nothing to free there."""
        if not stream.materialised:
            self._held.pop(stream.key, None)
            return asyncio.create_task(_nothing())
        dit_close = self._dit_lane.submit(lambda: self._b.dit.options(session_id=stream.dit_key).close.remote(
            stream.dit_key))  # the key is read when the close runs: a rebuild may change it until then
        pending = [t for t in stream.chunk_tasks if not t.done()]
        vae_close = None if pending else self._vae_lane.submit(self._vae_close_job(stream))
        task = asyncio.create_task(self._release(stream, pending, dit_close, vae_close))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _vae_close_job(self, stream: Stream) -> Callable[[], Awaitable[bool]]:
        return lambda: self._b.vae.options(session_id=stream.vae_key).close.remote(stream.vae_key)

    async def _release(self, stream: Stream, pending: list[asyncio.Task], dit_close: asyncio.Future,
                       vae_close: Optional[asyncio.Future]) -> None:
        """Wait for the closes (the VAE's once the chunks in flight are answered)."""
        await asyncio.gather(*pending, return_exceptions=True)
        if vae_close is None:
            vae_close = self._vae_lane.submit(self._vae_close_job(stream))
        results = await asyncio.gather(dit_close, vae_close, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                self._log.warning("close failed; the replica's TTL frees it",
                                  fields={"session": stream.key, "error": repr(r)})
        self._held.pop(stream.key, None)

    def expect_release(self, stream: Stream, within_s: float) -> None:
        """Tell both replicas that `stream` will be closed within `within_s` unless it is used
        again (a parked session's grace period): their `busy` answers count with it. Detached,
        bounded, best effort: a replica not told answers from its idle TTL."""
        async def tell(handle: DeploymentHandle, key: str) -> None:
            ended, result = await settle(handle.options(session_id=key).expect_release.remote(key, within_s),
                                         EXPECT_RELEASE_CALL_S)
            if not ended or isinstance(result, BaseException):
                self._log.info("replica not told when a parked session ends", fields={
                    "session": key, "error": repr(result) if ended else "timeout"})

        async def tell_both() -> None:
            await asyncio.gather(tell(self._b.dit, stream.dit_key), tell(self._b.vae, stream.vae_key))

        detach(tell_both(), name=f"expect-release-{stream.key}")

    async def teardown(self, parked: Optional[Stream], inflight: set[asyncio.Task]) -> None:
        """Connection end (any way it ends): drop the work not started, close every session
        still held on both deployments at once (a replica frees a session's slot at once and
        its memory when the call running for it ends; it refuses an open that arrives after the
        close, and frees a session closed while being opened), let the calls in flight finish
        (never cancelled: see lanes.py), and close again what a rebuild running meanwhile
        opened under a new key. The retired keys whose close was still queued are closed at
        once with the opened ones. Bounded by `connection.release_timeout_s`; the replicas' idle
        TTL frees whatever a replica could not be told in time. `parked`: the open session the
        parking took instead (resume.py), not closed; `inflight`: the connection's chunk tasks."""
        timeout = self._args.connection.release_timeout_s
        if parked is not None:  # its replicas hold it for the grace period: their `busy` hints say so
            self._held.pop(parked.key, None)
            self.expect_release(parked, self._args.sessions.resume.grace_s + PARKING_CLOSE_MARGIN_S)
        for t in [*inflight, *self._background]:
            t.cancel()  # local tasks waiting on lane futures; no Serve call is cancelled
        self._dit_lane.close()
        self._vae_lane.close()
        streams = list(self._held.values())
        self._held.clear()
        for stream in streams:
            if stream.state is not StreamState.CLOSED:
                stream.close()  # nobody holds it now: no lane job may start rebuilding it
            self._ended(stream)
        closed: set[str] = set()  # "dit:<key>", "vae:<key>"
        retired, self._retired = self._retired, set()  # answered opens (a rebuild starts once the last is done)
        await asyncio.gather(self._close_keys(retired, closed, timeout),
                             *(self._close_on_replicas(s, closed, timeout, opened_only=True) for s in streams))
        idle = await asyncio.gather(self._dit_lane.drain(timeout), self._vae_lane.drain(timeout))
        if not all(idle):
            self._log.warning("a call was still running at the release deadline",
                              fields={"timeout_s": timeout})
        # Opens that were in flight, and sessions a rebuild opened under a new key meanwhile.
        await asyncio.gather(*(self._close_on_replicas(s, closed, timeout) for s in streams))
        self._metrics.connection_released()

    async def _close_on_replicas(self, stream: Stream, closed: set[str], timeout_s: float,
                                 opened_only: bool = False) -> None:
        """Close the stream's current keys on both deployments (each once: `closed`).

        `opened_only`: skip a key whose open is still on its way. A close is routed to the
        replica the session is pinned to; before its open was routed there is no pin, and the
        close would reach any replica while the open lands on another, where nothing would
        ever close it. Such keys are closed once the lanes are drained."""
        def settled(open_call: Optional[asyncio.Future]) -> bool:
            return not opened_only or open_call is None or open_call.done()

        if not stream.materialised:  # served from the prefix store so far: no replica holds it
            return

        await self._close_keys({k for k, o in ((f"dit:{stream.dit_key}", stream.dit_open),
                                               (f"vae:{stream.vae_key}", stream.vae_open)) if settled(o)},
                               closed, timeout_s)

    async def _close_keys(self, tagged: set[str], closed: set[str], timeout_s: float) -> None:
        """Close each "dit:<key>" / "vae:<key>" of `tagged` not in `closed` (then added to it)."""
        calls = sorted(tagged - closed)
        closed.update(calls)
        handles = {"dit": self._b.dit, "vae": self._b.vae}

        async def close(tag: str) -> None:
            lane, key = tag.split(":", 1)
            ended, result = await settle(handles[lane].options(session_id=key).close.remote(key), timeout_s)
            if not ended or isinstance(result, BaseException):
                self._log.warning("close failed; the replica's idle TTL frees the session",
                                  fields={"session": key, "error": repr(result) if ended else "timeout"})

        await asyncio.gather(*(close(t) for t in calls))


async def _nothing() -> None:
    """The release of a stream no replica holds."""
