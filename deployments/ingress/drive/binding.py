"""Late binding: a driven chunk's camera is read from the keys held when its DiT job starts.

An infer's camera is fixed when the infer is read. A driven chunk is queued one chunk ahead
(driver.py), before the DiT can take it; its poses are integrated from the keys held at the
moment the DiT lane starts its job (once its conditioning y is ready), so a key pressed while
the previous chunk runs shows in the very next one. The chunk's reply reports the poses and the
`event_id` it was bound with (`ControlBook.annotate` awaits `bound`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from deployments.ingress.controls import ChunkCameras, ControlBook
from deployments.ingress.lane_jobs import LaneJobs
from deployments.ingress.stream import Stream


async def late_bound_step(jobs: LaneJobs, controls: ControlBook, stream: Stream, chunk_id: int,
                          y: asyncio.Future, bound: asyncio.Future[ChunkCameras], dit_started: Callable[[], None]):
    """DiT lane job of a driven chunk: tell the driver the DiT took it, wait for its y, bind its
    camera from the keys held now (recorded in `controls` and set on `bound`), then step."""
    dit_started()
    await asyncio.wait({y})
    if y.cancelled() or y.exception() is not None:
        return await jobs.step(stream, y, None, None)  # re-raises the condition's failure
    cams = controls.keyed(stream, chunk_id)
    controls.commit(stream, cams, chunk_id)
    bound.set_result(cams)
    return await jobs.step(stream, y, cams.poses, cams.intrinsics)
