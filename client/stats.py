"""Per-chunk timing of a streamed session and its summary (what a realtime user feels)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from camera import CHUNK_VIDEO_FRAMES, FPS

REALTIME_FPS = FPS
STAGE_ORDER = ("text_encode", "vae_encode", "dit", "vae_decode", "mux", "queue_wait", "total")
ONCE_STAGES = ("text_encode",)  # run for the first chunk only: reported from it, not averaged


@dataclass(frozen=True, slots=True)
class ChunkStat:
    """One answered chunk; times are seconds on the client's monotonic clock."""

    index: int
    num_frames: int
    sent_at: float  # when its request was sent (the last send, after busy retries)
    received_at: float  # when its frame reply arrived
    stage_durations: dict[str, float]  # the server's per-stage seconds
    cached: bool = False  # served from the server's prefix store (an earlier session with the same inputs made it)

    @property
    def latency_s(self) -> float:
        return self.received_at - self.sent_at


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """Time to first chunk, chunk interval percentiles, achieved fps and mean stage durations."""

    chunks: int
    frames: int
    time_to_first_chunk_s: float  # from the start of the session to the first frame reply
    interval_p50_s: Optional[float]  # between consecutive frame replies (None for one chunk)
    interval_p95_s: Optional[float]
    fps: float  # frames per second of wall time once streaming (after the first chunk)
    stage_means_s: dict[str, float]  # mean per computed chunk (ONCE_STAGES: the first chunk's value)
    cached: int = 0  # chunks served from the prefix store: their times are the store's, not the model's

    @classmethod
    def of(cls, stats: Sequence[ChunkStat], started_at: float) -> StreamSummary:
        if not stats:
            raise ValueError("no chunk was answered; nothing to summarise")
        received = np.array([s.received_at for s in stats])
        intervals = np.diff(received)  # [chunks - 1]
        ttfc = float(received[0] - started_at)
        if len(stats) > 1:
            fps = sum(s.num_frames for s in stats[1:]) / max(float(received[-1] - received[0]), 1e-9)
            p50, p95 = (float(v) for v in np.percentile(intervals, [50, 95]))
        else:
            fps, p50, p95 = stats[0].num_frames / max(ttfc, 1e-9), None, None
        order = {k: i for i, k in enumerate(STAGE_ORDER)}
        computed = [s for s in stats if not s.cached]  # a chunk from the prefix store ran no stage
        stages = sorted({k for s in computed for k in s.stage_durations if not (k in ONCE_STAGES and s is not stats[0])},
                        key=lambda k: (order.get(k, len(order)), k))
        means = {k: stats[0].stage_durations.get(k, 0.0) if k in ONCE_STAGES
                 else float(np.mean([s.stage_durations.get(k, 0.0) for s in computed])) for k in stages}
        return cls(len(stats), sum(s.num_frames for s in stats), ttfc, p50, p95, fps, means,
                   sum(s.cached for s in stats))

    @property
    def replayed(self) -> bool:
        """Most chunks came from the prefix store: the times are a replay's, not the model's."""
        return 2 * self.cached > self.chunks

    def format(self) -> str:
        """Human-readable multi-line summary."""
        def ms(v: Optional[float]) -> str:
            return "n/a" if v is None else f"{1000 * v:.0f} ms"

        realtime = "realtime" if self.fps >= REALTIME_FPS else f"{self.fps / REALTIME_FPS:.2f}x realtime"
        achieved = f"achieved: {self.fps:.1f} fps vs {REALTIME_FPS} fps ({realtime})"
        if self.replayed:  # the store's speed is no model's: no fps figure to mistake for one
            achieved = (f"achieved: replayed from the server's prefix store ({self.cached} of {self.chunks} chunks), "
                        "not generated: no generation speed to show")
        lines = [
            f"chunks: {self.chunks}, frames: {self.frames}",
            f"time to first chunk: {ms(self.time_to_first_chunk_s)}",
            f"chunk interval: p50 {ms(self.interval_p50_s)}, p95 {ms(self.interval_p95_s)} "
            f"(realtime needs <= {ms(CHUNK_VIDEO_FRAMES / REALTIME_FPS)})",
            achieved,
            "stages (mean per computed chunk): " + (", ".join(
                f"{k} {ms(v)}" + (" (first chunk)" if k in ONCE_STAGES else "")
                for k, v in self.stage_means_s.items()) or "none computed"),
        ]
        if self.cached:
            lines.append(f"from the server's prefix store: {self.cached} of {self.chunks} chunks (an earlier "
                         "session with the same inputs made them: the stage means leave them out, the times "
                         "above count them)")
        return "\n".join(lines)
