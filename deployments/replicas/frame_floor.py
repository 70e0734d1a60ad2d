"""FrameFloor: a DiT replica's frame-rate floor (`sessions.min_fps`, issue 46 item 1).

A new live session is admitted only while every live session on the replica keeps `min_fps`
frames/s with it. The compute lock goes round robin among the live sessions
(priority_lock.py), so each gets one chunk per cycle, a cycle being the sum of their chunk
steps: a session's rate is `CHUNK_VIDEO_FRAMES` (12; the first chunk's 9 aside) / cycle, the
same for all of them. The step times are the replica's own: an exponentially weighted mean of
the `step` calls' run seconds (the lock held: the 4 denoising calls, the deferred cache update,
a snapshot's copy) per bucket, (height, width, windowed): a chunk's cost depends on its size
and on whether it attends to a window or to all its frames. A bucket not measured yet adds
nothing to the estimate: before the replica has run any step, admission is by slots and bytes
alone (the first sessions of a size are admitted to measure it). A session is always admitted
to a replica holding no live session: refusing it would serve nobody.

The estimate takes every live session as streaming without pause (one held between its
client's chunks or a paused drive counts as if it streamed): a floor for the worst case of the
sessions admitted. A parked one (its socket dropped: the replica was told when it will be
closed, `SessionTable.expect_release`) does not count until it is used again (issue 54); one
that yielded its seat to the line (ingress/line/seat.py) is closed here, and counts once its
rebuild was admitted again. Offline sessions (`/v1/videos` jobs) run in the gaps of
the live ones and count neither in the cycle nor against the floor.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Optional

from camera.frames import CHUNK_VIDEO_FRAMES
from deployments.errors import Busy

EWMA_WEIGHT = 0.3  # of the newest step: a size's time settles within a few chunks, one slow step moves it little


class FrameFloor:
    """Measured step seconds per bucket, and the admission check against `min_fps` (0: off)."""

    def __init__(self, min_fps: float) -> None:
        self.min_fps = min_fps
        self._step_s: dict[Hashable, float] = {}

    def observe(self, bucket: Optional[Hashable], seconds: float) -> None:
        """One step of a session of `bucket` ran `seconds` (None: a session no longer held)."""
        if bucket is None:
            return
        before = self._step_s.get(bucket)
        self._step_s[bucket] = seconds if before is None else before + EWMA_WEIGHT * (seconds - before)

    def step_s(self, bucket: Hashable) -> Optional[float]:
        """The estimated step seconds of `bucket`; None before its first measurement."""
        return self._step_s.get(bucket)

    def cycle_s(self, buckets: Iterable[Optional[Hashable]]) -> float:
        """One chunk of each session of `buckets`, in turn (unmeasured buckets: 0)."""
        return sum(self._step_s.get(b, 0.0) for b in buckets if b is not None)

    def fps(self, buckets: Iterable[Optional[Hashable]]) -> float:
        """Frames/s of each live session when the sessions of `buckets` share the replica."""
        cycle = self.cycle_s(buckets)
        return float("inf") if cycle <= 0 else CHUNK_VIDEO_FRAMES / cycle

    def check(self, live: list[Optional[Hashable]], bucket: Optional[Hashable], retry_after_s: Callable[[], float]) -> None:
        """`Busy` (with `retry_after_s()`) when the live sessions `live` plus a new one of `bucket`
        would get less than `min_fps` each; nothing when the floor is off."""
        if self.min_fps <= 0 or not live:  # alone, a session gets what the replica can give: refusing serves nobody
            return
        fps = self.fps([*live, bucket])
        if fps >= self.min_fps:
            return
        retry = retry_after_s()
        raise Busy(f"this replica's frame-rate floor is {self.min_fps:g} frames/s per live session "
                   f"(sessions.min_fps): with one more session its {len(live)} live sessions would get "
                   f"{fps:.1f} (a chunk of {CHUNK_VIDEO_FRAMES} frames each every {self.cycle_s([*live, bucket]):.2f} s); "
                   f"retry in {retry:g} s", retry, ends_needed=self.ends_needed(live, bucket))

    def ends_needed(self, live: list[Optional[Hashable]], bucket: Optional[Hashable]) -> int:
        """How many of the `live` sessions must end before one of `bucket` keeps the floor (at
        least 1): the sessions that fit, at their mean measured step, against those held."""
        sessions = [*live, bucket]
        mean_step = self.cycle_s(sessions) / len(sessions)
        fit = int(CHUNK_VIDEO_FRAMES / (self.min_fps * mean_step)) if mean_step > 0 else len(sessions)
        return max(len(sessions) - max(fit, 1), 1)
