"""Metrics of the watch route (exported by Ray as `ray_<name>`; made in the ingress replica)."""
from __future__ import annotations

from ray.serve.metrics import Counter, Gauge


class WorldMetrics:
    """Viewers on this ingress replica, the bytes sent to them, the chunks slow viewers skipped."""

    def __init__(self) -> None:
        self.viewers = Gauge("lwf_world_viewers", description="Viewers of shared worlds on this ingress replica.")
        self.fanout_bytes = Counter("lwf_world_fanout_bytes",
                                    description="Bytes sent to viewers of shared worlds (frames and notices).")
        self.skipped = Counter("lwf_world_chunks_skipped",
                               description="Chunks a viewer's socket skipped because it read too slowly.")
