"""Late binding: a driven chunk's camera is read from the keys held when its DiT job starts.

An infer's camera is fixed when the infer is read. A driven chunk is queued one chunk ahead
(driver.py), before the DiT can take it; its poses are integrated from the keys held at the
moment the DiT lane starts its job (once its conditioning y is ready), so a key pressed while
the previous chunk runs shows in the very next one. The chunk's reply reports the poses and the
`event_id` it was bound with (`ControlBook.annotate` awaits `bound`).

Preemption (`controls.preempt`): while the DiT runs a driven chunk, a `control` whose keys
differ from the ones it was bound to asks the DiT replica to give it up at its next denoising
call (`DiTDeployment.preempt`, `preempt_running`). Its step then answers `Preempted` with the
session as before the chunk; the chunk is bound again from the keys held now (the camera
cursor taken back, `ControlBook.uncommit`) and made again. So a change shows one chunk sooner:
its lag is one DiT step + decode plus the part of a denoising call it waited for, instead of the
rest of the running chunk on top. A chunk is given up at most once (made again, it runs to its
end), so the keys changing all the time cannot starve the session.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from deployments.errors import Preempted
from deployments.ingress.controls import ChunkCameras, ControlBook
from deployments.ingress.detached import detach
from deployments.ingress.lanes import Backends
from deployments.ingress.lane_jobs import LaneJobs
from deployments.ingress.stream import Stream, StreamState


@dataclass(slots=True)
class BoundChunk:
    """A driven chunk on the DiT, bound to the keys held when it started."""

    chunk_id: int
    keys: tuple[str, ...]
    preemptible: bool  # it may be given up for newer keys (once: a chunk made again is not)
    asked: bool = False  # its preempt was sent


@dataclass(slots=True)
class Binding:
    """A driven session's chunk that the DiT runs now (one at a time: its lane is serial); the
    driver's (driver.py), written only here."""

    running: Optional[BoundChunk] = None


async def late_bound_step(jobs: LaneJobs, controls: ControlBook, stream: Stream, binding: Binding, chunk_id: int,
                          y: asyncio.Future, bound: asyncio.Future[ChunkCameras], dit_started: Callable[[], None],
                          preempt: bool = False):
    """DiT lane job of a driven chunk: tell the driver the DiT took it, wait for its y, bind its
    camera from the keys held now (recorded in `controls` and set on `bound`), then step; a
    preempted step (`preempt`: chunk 0, the scene as opened, never is) is bound and made again."""
    dit_started()
    await asyncio.wait({y})
    if y.cancelled() or y.exception() is not None:
        return await jobs.step(stream, y, None, None)  # re-raises the condition's failure
    preemptible, sid = preempt and chunk_id > 0, stream.spec.session_id
    while True:
        cams = controls.keyed(stream, chunk_id)
        controls.commit(stream, cams, chunk_id)
        mine = binding.running = BoundChunk(chunk_id, controls.keys_for(sid), preemptible)
        try:
            out = await jobs.step(stream, y, cams.poses, cams.intrinsics)
        except Preempted:
            controls.uncommit(stream, chunk_id)
            preemptible = False
            continue
        finally:
            if binding.running is mine:
                binding.running = None
        bound.set_result(cams)
        return out


def preempt_running(backends: Backends, stream: Stream, binding: Binding, keys: tuple[str, ...]) -> bool:
    """A control set `keys` for `stream`: ask the DiT to give its running driven chunk (in
    `binding`) up when that chunk was bound to other keys and may be (see the module doc). True
    when asked."""
    b = binding.running
    if b is None or not b.preemptible or b.asked or b.keys == tuple(keys) or stream.state is not StreamState.OPEN:
        return False
    b.asked = True
    key, chunk_id = stream.dit_key, b.chunk_id

    async def ask() -> None:
        try:
            await backends.dit.options(session_id=key).preempt.remote(key, chunk_id)
        except Exception:  # noqa: BLE001 - best effort: the chunk then runs to its end
            pass

    detach(ask(), f"preempt-{key}-{chunk_id}")
    return True
