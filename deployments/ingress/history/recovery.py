"""Session recovery: rebuild a session whose replica died or dropped it, from its journal.

A connection calls `Recovery.dit` / `Recovery.vae` from inside the lane job whose call failed
(so the lane stays serial and the journal is exactly at that call's position), then repeats
the call once. The session gets a fresh key on the rebuilt deployment: the router places it
like a new session (on a live replica with room), and late calls of the lost incarnation
cannot touch it; the lost key is closed first, so that the router drops its pin. A rebuild waits up to `sessions.recovery_timeout_s` for a
replica (Serve replaces dead ones; a full one may free a slot); when it cannot happen (recovery
off, journal over budget, no replica in time) the client gets `session_lost` as before.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from deployments.config import SessionArgs
from deployments.errors import Busy, SessionLost
from deployments.log import KeyValueLog
from deployments.metrics import IngressMetrics
from deployments.ingress.lane_jobs import REPLICA_GONE
from deployments.ingress.stream import Stream, StreamState

RETRY_MIN_S = 0.25
RETRY_MAX_S = 2.0


class Recovery:
    """Rebuilds one connection's sessions on the DiT and VAE deployments."""

    def __init__(self, dit, vae, sessions: SessionArgs, log: KeyValueLog, metrics: IngressMetrics) -> None:
        self._dit = dit
        self._vae = vae
        self._enabled = sessions.recovery
        self._timeout_s = sessions.recovery_timeout_s
        self._log = log
        self._metrics = metrics

    async def dit(self, stream: Stream, cause: BaseException) -> None:
        """Rebuild the DiT side (KV caches, camera, noise) under a new key; `SessionLost` when
        that is impossible."""
        j = stream.journal
        if not (self._enabled and j.recoverable and j.context is not None):
            raise self._lost("dit", cause)
        await self._forget(self._dit, stream.dit_key)
        key = stream.new_key("dit")
        context, past = j.context, await j.full_chunks()  # spilled chunks read back from the store
        t0 = time.perf_counter()
        dit = self._dit.options(session_id=key)
        replica = await self._until_placed("dit", stream, cause,
                                           lambda: dit.restore.remote(key, stream.spec, context, past, j.noise))
        stream.journal.recovered()
        self._metrics.count_recovery("dit", rebuilt=True)
        self._log.warning("session rebuilt on the DiT", fields={
            "session": key, "chunks": len(past), "replica": replica, "seconds": f"{time.perf_counter() - t0:.2f}",
            "cause": type(cause).__name__})

    async def vae(self, stream: Stream, cause: BaseException) -> None:
        """Rebuild the VAE side (encoder and decoder caches, muxer) under a new key."""
        j = stream.journal
        if not (self._enabled and j.recoverable):
            raise self._lost("vae", cause)
        await self._forget(self._vae, stream.vae_key)
        key = stream.new_key("vae")
        decoded = await j.full_decoded_latents()
        t0 = time.perf_counter()
        vae = self._vae.options(session_id=key)
        replica = await self._until_placed("vae", stream, cause, lambda: vae.restore.remote(
            key, stream.spec, j.image, j.conditioned, decoded))
        stream.journal.recovered()
        self._metrics.count_recovery("vae", rebuilt=True)
        self._log.warning("session rebuilt on the VAE", fields={
            "session": key, "conditioned": j.conditioned, "decoded": len(decoded), "replica": replica,
            "seconds": f"{time.perf_counter() - t0:.2f}", "cause": type(cause).__name__})

    async def _forget(self, handle, key: str) -> None:
        """Close the lost incarnation's key: a no-op on the replicas (none holds it), but the
        router then drops its pin, which would otherwise count as a taken slot for a while."""
        try:
            await handle.options(session_id=key).close.remote(key)
        except Exception as e:  # noqa: BLE001 - its replica may be gone; the pin then went with it
            self._log.info("close of a lost key failed", fields={"session": key, "error": repr(e)})

    async def _until_placed(self, deployment: str, stream: Stream, cause: BaseException,
                            call: Callable[[], Awaitable[str]]) -> str:
        """Run `call` until a replica takes it: retried while replicas are gone or full."""
        deadline = time.monotonic() + self._timeout_s
        wait = RETRY_MIN_S
        while True:
            try:
                return await call()
            except (Busy, *REPLICA_GONE) as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._log.warning("session rebuild gave up", fields={"session": stream.key, "error": repr(e)})
                    raise self._lost(deployment, cause) from e
                retry = getattr(e, "retry_after_s", wait)
                await asyncio.sleep(min(retry, left))
                wait = min(2 * wait, RETRY_MAX_S)
                if stream.state is not StreamState.OPEN:  # its client reset it or left meanwhile
                    raise self._lost(deployment, cause) from e

    def _lost(self, deployment: str, cause: BaseException) -> SessionLost:
        self._metrics.count_recovery(deployment, rebuilt=False)
        return SessionLost(f"the server lost this session ({type(cause).__name__}) and could not rebuild it; "
                           "send image and prompt to start again")
