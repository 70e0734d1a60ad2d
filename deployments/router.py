"""SessionAffinityRouter: hard session affinity for the stateful DiT and VAE deployments.

Every call that carries a session id (`handle.options(session_id=key)`) goes to the replica
that holds the session. A session is placed when its first call is routed (`reserve`:
admission ahead of the open; `open`; `restore`: a session rebuilt after its replica was
lost): on the replica with the most free session slots, and pinned at once, so that concurrent opens spread. Free
slots come from the replicas' `record_routing_stats` (capacity and the keys they hold), which
are up to a stats period old: the router corrects them by its own recent placements (a pin
counts until the stats could report it, `stats_fresh_s`; after that the stats say whether the
replica holds it: a session its replica dropped at its idle TTL no longer takes a slot) and
its closes since (ties broken at random). Later calls of the session wait for that replica (`[[pinned]]`
with backoff); they never spill over.

Slots are counted per class (issue 46): where a replica bounds offline sessions (`/v1/videos`
jobs, `SessionOptions.offline`) apart (`sessions.max_offline_sessions`: its stats' `offline_capacity`
and `apart` keys), a live session is placed by the live slots free, a job by the offline ones, and
neither class's sessions take the other's; without that bound every session takes a live slot, as
on the replica. The class of a session being placed is its open call's options (`args[1]`).

A call for a session without a pin goes to the replica whose last stats list the session's key
(a session opened through another router: another ingress replica, a resumed session, the
parking's expiry close), and is pinned there. Failing that (its replica died or was removed,
the pin expired, stats not yet reported) it goes to any replica: the replicas are
authoritative and answer `session_lost` for sessions they do not hold, so nothing restarts
silently. Pins are freed when a `close` call has been routed,
when their replica leaves, and after `pin_ttl_s` without a call (routers never learn that a
client went away).

A `clone` call (a fork at a session's head: the new session is a copy of live state) is routed
by the *source's* key, so it reaches the replica that holds the source; once it is routed the
new session's key (the call's second argument) is pinned to that same replica, as an open's is
(deployments/replicas/dit.py `clone`).

A call routed by a snapshot id (`<key>#<chunks>`, deployments/replicas/snapshots.py: a clone
from a session's snapshot) goes where the session's key is pinned, else where this router
routed its close (the last minute), else to the replica whose last stats list the snapshot,
else anywhere (its replica answers `NoSnapshot` and the ingress replays the journal instead).
It never places anything.

Set in code (`request_router_config` in `build_app`), never in YAML: a router class named in
YAML is imported by the dashboard outside the application's runtime_env.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from deployments.log import get_log
from deployments.replicas.snapshots import parse_snapshot_id

_SWEEP_PERIOD_S = 1.0
_CLOSED_MEMORY_S = 60.0  # closes remembered to correct stale stats (>> the stats period)


@dataclass(slots=True)
class _Pin:
    replica_id: ReplicaID
    last_used: float
    placed: float = 0.0  # when this router placed it (0: it followed the replicas' stats)
    offline: bool = False  # an offline session's (a `/v1/videos` job's): see the module doc


class SessionAffinityRouter(RequestRouter):
    """Places sessions by free capacity and pins every later call of a session."""

    def initialize_state(
        self, pin_ttl_s: float = 900.0, open_methods: tuple[str, ...] = ("reserve", "open", "restore"),
        close_method: str = "close", stats_fresh_s: float = 10.0, clone_method: str = "clone",
    ) -> None:
        """`stats_fresh_s`: how long after a placement the replicas' stats may still not list it."""
        self._pin_ttl_s = pin_ttl_s
        self._stats_fresh_s = stats_fresh_s
        self._open_methods = frozenset(open_methods)
        self._close_method = close_method
        self._clone_method = clone_method
        self._pins: dict[str, _Pin] = {}
        # session -> when and where this router routed its close (its snapshots stay there)
        self._closed: dict[str, tuple[float, ReplicaID]] = {}
        self._last_sweep = time.monotonic()
        self._log = get_log("router", deployment=self._deployment_id.name)

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        # Without backoff the retry loop spins when every chosen replica is full.
        pending_request.routing_context.should_backoff = True
        sid = pending_request.metadata.session_id
        if not sid:
            return [candidate_replicas]
        now = time.monotonic()
        self._sweep(now)
        snapshot = parse_snapshot_id(sid)
        if snapshot is not None:
            return [self._snapshot_holder(sid, snapshot[0], candidate_replicas)]
        pin = self._pins.get(sid)
        if pin is not None and pin.replica_id not in self.curr_replicas:  # left before we were told
            self._drop_pins_not_in(set(self.curr_replicas))
            pin = None
        if pin is not None:
            pin.last_used = now
            return [[self.curr_replicas[pin.replica_id]]]
        if pending_request.metadata.call_method not in self._open_methods:
            holder = self._reported_holder(sid, candidate_replicas)
            if holder is None:  # unknown session: any replica answers session_lost (it does not hold it)
                return [candidate_replicas]
            self._pins[sid] = _Pin(holder.replica_id, now)
            return [[holder]]
        args = pending_request.args
        offline = len(args) > 1 and bool(getattr(args[1], "offline", False))  # reserve/open/restore(key, options, ...)
        best = self._most_free(candidate_replicas, offline)
        self._pins[sid] = _Pin(best.replica_id, now, placed=now, offline=offline)
        self._log.info("placed session", fields={"session": sid, "replica": best.replica_id.unique_id})
        return [[best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        meta = pending_request.metadata
        if meta.session_id and meta.call_method == self._close_method:
            self._pins.pop(meta.session_id, None)
            self._closed[meta.session_id] = (time.monotonic(), replica_id)
        elif meta.session_id and meta.call_method == self._clone_method and len(pending_request.args) > 1:
            new_key, now = pending_request.args[1], time.monotonic()  # clone(source_key, new_key, ...)
            self._pins[new_key] = _Pin(replica_id, now, placed=now)
            self._log.info("placed session", fields={"session": new_key, "replica": replica_id.unique_id,
                                                     "cloned_from": meta.session_id})

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._drop_pins_not_in(set(self.curr_replicas))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._drop_pins_not_in(set(self.curr_replicas))

    def _most_free(self, candidates: List[RunningReplica], offline: bool = False) -> RunningReplica:
        """The replica with the most free session slots of the class `offline` (ties at random)."""
        mine: dict[ReplicaID, dict[str, bool]] = {}  # placed here recently: the stats may not list them yet
        fresh_since = time.monotonic() - self._stats_fresh_s
        for sid, pin in self._pins.items():
            if pin.placed > fresh_since:
                mine.setdefault(pin.replica_id, {})[sid] = pin.offline

        def free_slots(r: RunningReplica) -> int:
            stats = r.routing_stats or {}
            recent = mine.get(r.replica_id, {})
            keys = set(stats.get("keys", ())) - self._closed.keys()
            # Before a replica's first stats report (capacity 0) only the order of others counts.
            capacity = int(stats.get("capacity", 0))
            if stats.get("offline_capacity") is None:  # every session takes a live slot
                return capacity - len(keys | recent.keys())
            apart = set(stats.get("apart", ()))
            held = (keys & apart if offline else keys - apart) | {s for s, o in recent.items() if o == offline}
            return (int(stats["offline_capacity"]) if offline else capacity) - len(held)

        return max(candidates, key=lambda r: (free_slots(r), random.random()))

    def _snapshot_holder(self, snapshot: str, key: str, candidates: List[RunningReplica]) -> List[RunningReplica]:
        """Where a snapshot is: its session's pinned replica, else the replica whose stats list it."""
        pin = self._pins.get(key)
        closed = self._closed.get(key)
        where = pin.replica_id if pin is not None else closed[1] if closed is not None else None
        if where is not None and where in self.curr_replicas:
            return [self.curr_replicas[where]]
        for r in candidates:
            if snapshot in (r.routing_stats or {}).get("snapshots", ()):
                return [r]
        holder = self._reported_holder(key, candidates)
        return [holder] if holder is not None else candidates

    @staticmethod
    def _reported_holder(sid: str, candidates: List[RunningReplica]) -> Optional[RunningReplica]:
        """The replica whose last stats list `sid` (a session another router placed)."""
        for r in candidates:
            if sid in (r.routing_stats or {}).get("keys", ()):
                return r
        return None

    def _drop_pins_not_in(self, live: set) -> None:
        gone = [sid for sid, p in self._pins.items() if p.replica_id not in live]
        for sid in gone:
            self._log.warning(
                "replica left; session unpinned (its next call gets session_lost, then a rebuild)",
                fields={"session": sid, "replica": self._pins.pop(sid).replica_id.unique_id},
            )

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < _SWEEP_PERIOD_S:
            return
        self._last_sweep = now
        stale = [sid for sid, p in self._pins.items() if now - p.last_used > self._pin_ttl_s]
        for sid in stale:
            del self._pins[sid]
        for sid in [sid for sid, (t, _) in self._closed.items() if now - t > _CLOSED_MEMORY_S]:
            del self._closed[sid]
