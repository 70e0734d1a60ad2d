"""HeldSessionsPolicy: Serve autoscaling of the DiT and VAE deployments by the sessions they hold.

Request rate says nothing here: a session holds its replica (KV cache, VAE caches) between
chunks, when no request is in flight, so Serve's default policy (ongoing requests) would
remove a replica full of sessions as soon as their clients think. Each replica publishes, via
Serve's `record_autoscaling_stats` (deployments/replicas/session_host.py):

* `load`: the share of the replica's capacity its sessions take (the larger of slots and
  budget bytes), and
* `refused`: how many new sessions its admission answered `busy` since it started.

The policy wants `ceil(sum(load) / target_fill)` replicas, so that the sessions held fit the
others when one goes (scale-down moves them by journal replay, deployments/ingress/history/recovery.py), and
one replica more than the current target as soon as admission starts answering `busy` (a
full replica refuses before the held sessions cross a threshold). That raise is kept while the
new replica starts and for one `look_back_period_s` after it runs (the refused sessions retry
and land there); refusals while it starts ask for nothing more, refusals once it runs ask
for one more again. Then the held sessions decide.
Serve then applies min/max replicas and the up/down-scale delays around it.

Serve cloudpickles this module by value into its controller: it imports nothing from the
project, so the controller needs no runtime_env (unlike a router named in YAML).
"""
from __future__ import annotations

import math
from typing import Any

LOAD = "load"  # the metric names replicas publish (record_autoscaling_stats)
REFUSED = "refused"
_SEEN = "lwf_refused_seen"  # policy_state keys: refusals already answered, the raise asked for
_FLOOR = "lwf_floor"
_RAN = "lwf_floor_running_since"


class HeldSessionsPolicy:
    """`policy_function` of the DiT and VAE `autoscaling_config` (Serve instantiates it once
    with `policy_kwargs` and calls it every control-loop tick)."""

    def __init__(self, target_fill: float = 1.0) -> None:
        if not 0 < target_fill <= 1:
            raise ValueError(f"target_fill must be in (0, 1], got {target_fill}")
        self.target_fill = target_fill

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        """`ctx` is Serve's AutoscalingContext; returns (desired replicas, policy state)."""
        state = dict(ctx.policy_state or {})
        loads = (ctx.aggregated_metrics or {}).get(LOAD, {})
        desired = math.ceil(sum(loads.values()) / self.target_fill - 1e-9)
        refused = sum(series[-1].value for series in (ctx.raw_metrics or {}).get(REFUSED, {}).values() if series)
        floor = min(int(state.get(_FLOOR, 0)), ctx.capacity_adjusted_max_replicas)
        if floor and ctx.current_num_replicas >= floor:  # the raise is running
            ran = state.setdefault(_RAN, ctx.current_time)
            if ctx.current_time - ran >= ctx.config.look_back_period_s:
                floor = 0  # the refused sessions had their chance: the held ones decide now
        seen = state.get(_SEEN, 0)
        if refused < seen:  # a replica with refusals left
            seen = refused
        if refused > seen and ctx.current_num_replicas >= floor:  # admission answers busy
            floor = min(ctx.target_num_replicas + 1, ctx.capacity_adjusted_max_replicas)
            state.pop(_RAN, None)
        seen = refused  # refusals while the raise starts are answered by it
        if floor <= desired:
            floor = 0
            state.pop(_RAN, None)
        state[_FLOOR], state[_SEEN] = floor, seen
        return max(desired, floor), state  # Serve bounds it by min_replicas / max_replicas


def replica_load(sessions: int, max_sessions: int, reserved_bytes: int, budget_bytes: int | None) -> float:
    """A replica's `load`: its sessions' share of its slots or of its byte budget, the larger."""
    load = sessions / max_sessions
    if budget_bytes:
        load = max(load, reserved_bytes / budget_bytes)
    return load
