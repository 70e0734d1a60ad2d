"""The lane jobs of a `Connection`: each one call to one deployment (connection.py).

Admission first: a new session's DiT lane job reserves its slot and bytes on a DiT replica
(`DiTDeployment.reserve`, by size and length alone) before anything is computed for it; its
text encode waits for that and for the VAE's admission (its `open`), and its first VAE
condition (the costly image encode) for the DiT's. A session that cannot fit is answered
`busy` / `too_large` at once, having cost no model work.

A call that finds its replica dead or the session gone rebuilds the session from its journal
on a healthy replica (recovery.py), inside the same lane job, and is made again. The lanes
are the connection's (it queues these jobs on them); a step queues its chunk's decode on the
VAE lane itself.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Optional, Protocol, TypeVar

import numpy as np
from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError

from deployments.errors import Busy, ReplicaError, SessionLost
from deployments.ingress.detached import retrieved, settle
from deployments.ingress.lanes import ReplicaLanes
from deployments.ingress.line.seat import LineSeats
from deployments.ingress.stream import Stream, StreamState
from deployments.wire import ChunkStep, StepResult

T = TypeVar("T")
REPLICA_GONE = (RayActorError, ReplicaUnavailableError)  # the replica died or left mid-call
RELEASE_RESERVATION_S = 10.0  # a DiT reservation given back (the VAE was full) is waited for this long at most


def needs_recovery(error: BaseException) -> bool:
    """True for the failures a rebuild can cure: the replica does not hold the session (any
    more) or it died under the call."""
    return isinstance(error, (SessionLost, *REPLICA_GONE))


class Rebuilds(Protocol):
    """What the lane jobs need of a recovery (history/recovery.py): the session made again on
    one deployment under a new key, or `SessionLost`."""

    async def dit(self, stream: Stream, cause: BaseException) -> None: ...

    async def vae(self, stream: Stream, cause: BaseException) -> None: ...


class LaneJobs:
    """The VAE and DiT lane jobs of one connection's sessions."""

    def __init__(self, replicas: ReplicaLanes, recovery: Rebuilds, seats: LineSeats) -> None:
        self._b = replicas.backends
        self._dit_lane = replicas.dit_lane
        self._vae_lane = replicas.vae_lane
        self._recovery = recovery
        self._log = replicas.log
        self.seats = seats  # the waiting room's seats of the connection's new live sessions (line/seat.py)

    def open(self, stream: Stream) -> None:
        """Open a new session on the VAE and the DiT (admission, prompt, image): queued on the
        lanes. A session that waits in line holds nothing on any replica: its admission, when
        its turn comes, is the DiT's reservation and then the VAE's open (a `busy` of either
        keeps it in line, the reservation given back), which its VAE lane job waits for."""
        spec, image = stream.spec, stream.image
        queued = self.seats.queues(stream)

        async def open_vae() -> Any:
            key = stream.vae_key
            return await self._b.vae.options(session_id=key).open.remote(key, spec, image)

        async def opened_in_admission() -> None:
            await dit_admitted(stream)
        vae = self._vae_lane.submit(opened_in_admission if queued else open_vae)
        if queued:
            vae.add_done_callback(retrieved)  # a refusal in line is answered through the DiT's admission
        stream.opening(vae=vae, dit=self._dit_lane.submit(partial(self.open_dit, stream, open_vae if queued else None)))

    async def open_dit(self, stream: Stream, open_vae: Optional[Callable[[], Awaitable[Any]]] = None) -> None:
        """DiT lane: admit the session on a DiT replica (busy, too_large; a new live session
        first waits its turn in line, and `open_vae` is then part of its admission), wait for the
        VAE's admission, encode the prompt, then open the session where it was admitted."""
        await reserve_dit(self._b.dit, stream, self.seats, open_vae)  # no text encode for a refused session
        key = stream.dit_key
        t = time.perf_counter()
        context = await self._b.text.encode.remote(stream.spec.prompt, stream.spec.owner)  # cached per owner
        stream.journal.opened(time.perf_counter() - t)
        stream.journal.set_context(context)
        replica = await self._b.dit.options(session_id=key).open.remote(key, stream.spec, context)
        self._log.info("session opened", fields={"session": key, "dit_replica": replica})

    def encode_later(self, prompt: str, owner: str) -> asyncio.Future:
        """The text context of a prompt update, encoded now (concurrently with the lanes)."""
        async def encode() -> np.ndarray:
            return await self._b.text.encode.remote(prompt, owner)
        return asyncio.ensure_future(encode())

    async def condition(self, stream: Stream, timings: dict[str, float]) -> np.ndarray:
        """VAE lane: the chunk's conditioning y (a new session's first, once the DiT admitted it)."""
        await dit_admitted(stream)
        t = time.perf_counter()
        y = await self._on_vae(stream, lambda key: self._b.vae.options(session_id=key).condition.remote(key))
        stream.journal.conditioned += 1
        timings["vae_encode"] = time.perf_counter() - t
        return y

    async def step(self, stream: Stream, y_fut: asyncio.Future, poses: np.ndarray, intrinsics: np.ndarray,
                   context_fut: Optional[asyncio.Future] = None) -> tuple[StepResult, asyncio.Future]:
        """DiT lane: one chunk step (rebuilding the session first when it was lost); queues the
        chunk's decode on the VAE lane when done. `context_fut`: the encoding of a prompt
        update (prompt steering), applied by the DiT before this chunk and journaled with it."""
        y = await y_fut
        context = None if context_fut is None else await context_fut

        def step(key: str) -> Awaitable[StepResult]:
            return self._b.dit.options(session_id=key).step.remote(key, ChunkStep(y, poses, intrinsics, context))

        try:
            await stream.dit_open  # re-raises the open's failure
            if await self.seats.turn_over(stream):  # its turn is over while others wait: in line again
                await self._next_turn(stream)
            out = await step(stream.dit_key)
        except Exception as e:
            if not needs_recovery(e) or stream.state is not StreamState.OPEN:  # reset or failed: no rebuild
                raise
            await self._recovery.dit(stream, e)
            stream.reopened("dit")
            out = await step(stream.dit_key)
        stream.journal.add_chunk(poses, intrinsics, y, out.latents, out.noise, context, out.kv_growth)
        self.seats.chunk_done(stream, out.dit_s)
        decoded = self._vae_lane.submit(partial(self.decode, stream, out.latents))
        return out, decoded

    async def _next_turn(self, stream: Stream) -> None:
        """DiT lane, at a chunk boundary: the session's DiT state is closed (its place is the
        line's), and once its turn comes again it is rebuilt from its journal under a new key
        (its VAE state stays: the line waits for DiT places)."""
        old = stream.dit_key
        await settle(self._b.dit.options(session_id=old).close.remote(old), RELEASE_RESERVATION_S)
        stream.new_key("dit")
        await reserve_dit(self._b.dit, stream, self.seats)
        key, j = stream.dit_key, stream.journal  # a try after a `busy` took another key
        past = await j.full_chunks()  # spilled chunks read back from the store (journal_spill.py)
        await self._b.dit.options(session_id=key).restore.remote(key, stream.spec, j.context, past, j.noise)

    async def decode(self, stream: Stream, latents: np.ndarray) -> dict[str, Any]:
        """VAE lane: decode and mux one chunk."""
        out = await self._on_vae(stream, lambda key: self._b.vae.options(session_id=key).decode.remote(key, latents))
        stream.journal.decoded += 1
        return out

    async def _on_vae(self, stream: Stream, call: Callable[[str], Awaitable[T]]) -> T:
        """`call(vae_key)` inside a VAE lane job; the session is rebuilt once when it was lost."""
        try:
            await stream.vae_open  # re-raises the open's failure
            return await call(stream.vae_key)
        except Exception as e:
            if not needs_recovery(e) or stream.state is not StreamState.OPEN:  # reset or failed: no rebuild
                raise
            await self._recovery.vae(stream, e)
            stream.reopened("vae")
            return await call(stream.vae_key)


async def reserve_dit(dit: Any, stream: Stream, seats: Optional[LineSeats] = None,
                      open_vae: Optional[Callable[[], Awaitable[Any]]] = None) -> None:
    """Admit `stream` on a DiT replica (`dit`: the deployment's handle) before any work: its
    admission future settled either way (busy, too_large re-raised), then wait for the VAE's
    admission (its refusal re-raised). A new session, a fork and a session leaving the prefix
    store all start this way; a new live session waits its turn in line first (`seats`). Each
    try after a `busy` goes under a new DiT key: the router pinned the refused one to the
    replica that refused it. `open_vae` (a session in line): its VAE open after the DiT's
    reservation, in the same try; the VAE's `busy` gives the reservation back and keeps the
    session in line (a new VAE key next time)."""
    admitted = stream.dit_admission()
    tries = 0

    async def reserve() -> None:
        nonlocal tries
        tries += 1
        key = stream.dit_key if tries == 1 else stream.new_key("dit")
        await dit.options(session_id=key).reserve.remote(key, stream.spec)
        if open_vae is None:
            return
        try:
            await open_vae()
        except Busy:
            await settle(dit.options(session_id=key).close.remote(key), RELEASE_RESERVATION_S)
            stream.new_key("vae")
            raise

    try:
        await (reserve() if seats is None else seats.admit(stream, reserve))
    except Exception as e:
        if not admitted.done():
            admitted.set_exception(e)
        raise
    if not admitted.done():
        admitted.set_result(None)
    await stream.vae_open


async def dit_admitted(stream: Stream) -> None:
    """Until the DiT admitted the stream; its refusal (busy, too_large) re-raised. A stream not
    opened by `open_dit` (resumed, rebuilt) ends the wait with its `dit_open`; a failure of
    another kind (a replica died) is left to the step, which rebuilds the session."""
    admitted, opened = stream.dit_admission(), stream.dit_open
    if opened is not None:
        opened.add_done_callback(retrieved)  # a refusal reaches the client through the condition
    if not admitted.done() and opened is not None:
        await asyncio.wait({admitted, opened}, return_when=asyncio.FIRST_COMPLETED)
    settled = admitted if admitted.done() else opened
    if settled is None:
        return
    if settled.cancelled():
        raise asyncio.CancelledError("the session's open was dropped")
    if isinstance(settled.exception(), ReplicaError):
        raise settled.exception()
