"""Prometheus metrics of the serving graph (exported by Ray as `ray_<name>`).

Ray adds the `application`, `deployment` and `replica` tags. Create the objects inside a
replica (its constructor), where the Serve context exists.
"""
from __future__ import annotations

from ray.serve.metrics import Counter, Gauge, Histogram

FPS_BOUNDARIES = [0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0]
LATENCY_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


class IngressMetrics:
    """Per-chunk stage latencies and error replies, recorded by the ingress."""

    def __init__(self) -> None:
        self.chunk_stage_seconds = Histogram(
            "lwf_chunk_stage_seconds",
            description="Seconds one chunk spent in each stage (tag stage; total = infer to reply).",
            boundaries=LATENCY_BOUNDARIES_S,
            tag_keys=("stage",),
        )
        self.errors = Counter(
            "lwf_error_replies",
            description="Error replies sent to clients, by protocol error code.",
            tag_keys=("code",),
        )
        self.connections = Gauge(
            "lwf_websocket_connections", description="Open WebSocket connections on this replica."
        )
        self.recoveries = Counter(
            "lwf_session_recoveries",
            description="Sessions rebuilt from the ingress's journal after their replica was lost "
            "(tag component: dit or vae; outcome: rebuilt or lost).",
            tag_keys=("component", "outcome"),
        )

        self.releases = Counter(
            "lwf_connection_releases",
            description="Connections whose sessions were all released after the socket ended.",
        )
        self.refused_connections = Counter(
            "lwf_refused_connections",
            description="WebSockets refused at the handshake (tag reason: connection caps, auth, origin).",
            tag_keys=("reason",),
        )

        self.session_fps = Histogram(
            "lwf_session_frames_per_second", description="Video frames per second a live session admitted "
            "through the waiting room received over its life (the frames of its chunks after the first / time "
            "from its first chunk to its last).", boundaries=FPS_BOUNDARIES)

    def observe_session_fps(self, fps: float) -> None:
        self.session_fps.observe(fps)

    def connection_released(self) -> None:
        self.releases.inc()

    def refuse_connection(self, reason: str) -> None:
        self.refused_connections.inc(tags={"reason": reason})

    def observe_chunk(self, durations: dict[str, float]) -> None:
        for stage, seconds in durations.items():
            self.chunk_stage_seconds.observe(seconds, tags={"stage": stage})

    def count_error(self, code: str) -> None:
        self.errors.inc(tags={"code": code})

    def count_recovery(self, component: str, rebuilt: bool) -> None:
        self.recoveries.inc(tags={"component": component, "outcome": "rebuilt" if rebuilt else "lost"})


class PrefixMetrics:
    """The prefix store of one ingress replica (deployments/ingress/prefix/)."""

    def __init__(self) -> None:
        self.hits = Counter("lwf_prefix_cache_hits", description="Chunks served from the prefix store.")
        self.misses = Counter(
            "lwf_prefix_cache_misses",
            description="Chunks of sessions that use the prefix store which the model computed (not stored).",
        )
        self.evictions = Counter("lwf_prefix_cache_evictions", description="Stored chunks evicted (LRU, by bytes).")
        self.bytes = Gauge("lwf_prefix_cache_bytes", description="Bytes the prefix store holds.")
        self.entries = Gauge("lwf_prefix_cache_entries", description="Nodes the prefix store holds (chunks and roots).")
        self.materialisations = Counter(
            "lwf_prefix_cache_materialised", tag_keys=("path",),
            description="Sessions served from the prefix store that left it, by how the DiT got their state: "
                        "from a replica's snapshot, or by the journal's replay.")
        self.materialised: dict[str, int] = {}  # the same, for /healthz

    def count_materialised(self, path: str) -> None:
        self.materialisations.inc(tags={"path": path})
        self.materialised[path] = self.materialised.get(path, 0) + 1

    def count_hit(self) -> None:
        self.hits.inc()

    def count_miss(self) -> None:
        self.misses.inc()

    def count_eviction(self) -> None:
        self.evictions.inc()

    def held(self, nbytes: int, entries: int) -> None:
        self.bytes.set(nbytes)
        self.entries.set(entries)


class SessionMetrics:
    """Sessions held by one DiT or VAE replica (the `deployment` tag tells which)."""

    def __init__(self) -> None:
        self.active = Gauge("lwf_sessions_active", description="Sessions held by this replica.")
        self.held = Gauge(
            "lwf_sessions_held", tag_keys=("class",),
            description="Sessions held by this replica by class (issue 46): live (a person watching) or offline "
                        "(a /v1/videos job); reservations and opens in progress included.",
        )
        self.chunks = Counter(
            "lwf_chunks_computed", tag_keys=("class",),
            description="Chunks the DiT computed, by the class of their session: live or offline (a /v1/videos job).",
        )
        self.admitted = Counter("lwf_sessions_admitted", description="Sessions admitted.")
        self.rejected = Counter(
            "lwf_sessions_rejected", description="New sessions refused with busy (no capacity)."
        )
        self.expired = Counter(
            "lwf_sessions_expired", description="Sessions dropped after idle_ttl_s without a call."
        )
        self.preempted = Counter(
            "lwf_chunks_preempted",
            description="Driven chunks the DiT gave up for newer keys and made again (controls.preempt).",
        )
        self.cache_bytes = Gauge(
            "lwf_session_cache_bytes",
            description="Bytes of per-session caches held (DiT: KV + cross-attention caches).",
        )
        self.snapshot_bytes = Gauge(
            "lwf_snapshot_bytes",
            description="Bytes of the snapshots of sessions this replica keeps (prefix_cache.snapshot_mib), "
            "in its session budget's spare bytes.",
        )

        self.call_wait_seconds = Histogram(
            "lwf_call_wait_seconds",
            description="Seconds a model call waited for the replica's compute lock (tag call).",
            boundaries=LATENCY_BOUNDARIES_S,
            tag_keys=("call",),
        )
        self.call_seconds = Histogram(
            "lwf_call_seconds",
            description="Seconds a model call ran holding the compute lock (tag call; a DiT chunk "
            "includes its cache update).",
            boundaries=LATENCY_BOUNDARIES_S,
            tag_keys=("call",),
        )

    def update(self, sessions: int, cache_bytes: int, snapshot_bytes: int = 0,
               by_class: tuple[int, int] = (0, 0)) -> None:
        """`by_class`: (live, offline) sessions held."""
        self.active.set(sessions)
        self.held.set(by_class[0], tags={"class": "live"})
        self.held.set(by_class[1], tags={"class": "offline"})
        self.cache_bytes.set(cache_bytes)
        self.snapshot_bytes.set(snapshot_bytes)

    def count_chunk(self, offline: bool) -> None:
        self.chunks.inc(tags={"class": "offline" if offline else "live"})

    def observe_call(self, call: str, waited_s: float, ran_s: float) -> None:
        self.call_wait_seconds.observe(waited_s, tags={"call": call})
        self.call_seconds.observe(ran_s, tags={"call": call})


WAIT_BOUNDARIES_S = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0]


class LineMetrics:
    """The waiting room's line (recorded by its one replica, deployments/ingress/line/room.py)."""

    def __init__(self) -> None:
        self.waiting = Gauge("lwf_waiting_sessions", description="Sessions waiting in line for a place.")
        self.seated = Gauge("lwf_seated_sessions",
                            description="Live sessions admitted through the line and not ended yet.")
        self.wait_seconds = Histogram(
            "lwf_wait_seconds", description="Seconds a session waited in line before its admission "
            "(0 for one admitted at once).", boundaries=WAIT_BOUNDARIES_S)
        self.refused = Counter("lwf_line_refusals", description="Sessions refused because the line was full.")

    def update(self, waiting: int, seated: int, waits_s: list[float]) -> None:
        self.waiting.set(waiting)
        self.seated.set(seated)
        for w in waits_s:
            self.wait_seconds.observe(w)

