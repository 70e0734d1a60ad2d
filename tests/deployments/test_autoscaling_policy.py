"""HeldSessionsPolicy against Serve's real AutoscalingContext and its wrapper (bounds, delays):
held sessions keep replicas, `busy` refusals add one, a scale-down waits for the load to fit."""
from __future__ import annotations

import math
import time

import pytest
from ray.serve._private.autoscaling_state import _apply_autoscaling_config
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.app import autoscaling_config, replica_options
from deployments.autoscaling_policy import LOAD, REFUSED, HeldSessionsPolicy, replica_load
from deployments.config import AppArgs, AutoscalingArgs

DEP = DeploymentID(name="DiTDeployment", app_name="lwf")


class Loop:
    """Serve's control loop for one deployment: the wrapped policy, bounded like the controller."""

    def __init__(self, replicas: int = 1, **args) -> None:
        self.config = AutoscalingConfig(**autoscaling_config(AutoscalingArgs(**args)))
        self.policy = _apply_autoscaling_config(self.config.policy.get_policy()(**self.config.policy.policy_kwargs))
        self.target = replicas
        self.state: dict = {}
        self.now = 1000.0

    def tick(self, loads: list[float], refused: list[int], dt: float = 1.0) -> int:
        self.now += dt
        ids = [ReplicaID(unique_id=f"r{i}", deployment_id=DEP) for i in range(len(loads))]
        ctx = AutoscalingContext(
            deployment_id=DEP, deployment_name=DEP.name, app_name=DEP.app_name, current_num_replicas=len(loads),
            target_num_replicas=self.target, running_replicas=ids, total_num_requests=0.0, total_queued_requests=0.0,
            aggregated_metrics={LOAD: dict(zip(ids, loads))},
            raw_metrics={REFUSED: {r: [TimeStampedValue(self.now, float(n))] for r, n in zip(ids, refused)}},
            capacity_adjusted_min_replicas=self.config.min_replicas,
            capacity_adjusted_max_replicas=self.config.max_replicas, policy_state=self.state,
            last_scale_up_time=None, last_scale_down_time=None, current_time=self.now, config=self.config)
        decision, self.state = self.policy(ctx)
        self.target = max(self.config.min_replicas, min(self.config.max_replicas, math.ceil(decision)))
        return self.target


def test_held_sessions_keep_replicas_without_requests():
    """Full replicas with no request in flight (clients between chunks) keep their count."""
    loop = Loop(replicas=2, max_replicas=4, downscale_delay_s=0)
    for _ in range(5):
        assert loop.tick([1.0, 1.0], [0, 0]) == 2


def test_busy_adds_one_replica_kept_while_it_starts_and_one_look_back_after():
    loop = Loop(replicas=1, max_replicas=3, downscale_delay_s=0, look_back_period_s=2)
    assert loop.tick([1.0], [0]) == 1
    assert loop.tick([1.0], [3]) == 2  # admission answered busy: one more
    assert loop.tick([1.0], [4]) == 2  # starting: kept, and more refusals meanwhile ask nothing more
    assert loop.tick([1.0, 0.0], [4, 0]) == 2  # running: kept one look-back period ...
    assert loop.tick([1.0, 0.0], [4, 0]) == 2
    assert loop.tick([1.0, 0.0], [4, 0]) == 1  # ... then no session came: the held ones decide
    assert loop.tick([1.0], [4]) == 1


def test_a_refused_session_that_lands_keeps_the_new_replica():
    loop = Loop(replicas=1, max_replicas=2, downscale_delay_s=0, look_back_period_s=1)
    assert loop.tick([1.0], [1]) == 2
    for _ in range(4):
        assert loop.tick([1.0, 1.0], [1, 0]) == 2
    assert loop.tick([1.0, 1.0], [2, 0]) == 2  # busy at max_replicas: nothing to add
    assert loop.state["lwf_floor"] == 0


def test_busy_raise_waits_for_the_upscale_delay():
    """(Serve's delay logic runs on the wall clock.)"""
    loop = Loop(replicas=1, max_replicas=3, upscale_delay_s=0.3, downscale_delay_s=0)
    assert loop.tick([1.0], [1]) == 1  # the raise is kept in the policy state ...
    assert loop.tick([1.0], [1]) == 1
    time.sleep(0.35)
    assert loop.tick([1.0], [1]) == 2  # ... until the delay passed


def test_scale_down_only_when_the_load_fits_the_rest_and_after_the_delay():
    loop = Loop(replicas=3, max_replicas=3, downscale_delay_s=0.3)
    assert loop.tick([1.0, 1.0, 0.5], [0, 0, 0]) == 3  # 2.5 replicas of sessions: all three stay
    time.sleep(0.35)
    assert loop.tick([1.0, 1.0, 0.5], [0, 0, 0]) == 3
    assert loop.tick([1.0, 0.5, 0.0], [0, 0, 0]) == 3  # 1.5: two would do, after the delay
    assert loop.tick([1.0, 0.5, 0.0], [0, 0, 0]) == 3
    time.sleep(0.35)
    assert loop.tick([1.0, 0.5, 0.0], [0, 0, 0]) == 2


def test_target_fill_keeps_headroom():
    loop = Loop(replicas=1, max_replicas=4, target_fill=0.5, downscale_delay_s=0)
    assert loop.tick([0.75], [0]) == 2


def test_replica_load_is_the_larger_of_slots_and_bytes():
    assert replica_load(1, 4, 0, None) == 0.25
    assert replica_load(1, 4, 900, 1000) == 0.9
    assert replica_load(0, 4, 0, 1000) == 0.0


def test_options_autoscale_dit_and_vae_from_config():
    args = AppArgs.model_validate({"dit": {"autoscaling": {"min_replicas": 1, "max_replicas": 3}},
                                   "vae": {"autoscaling": {"max_replicas": 2, "target_fill": 0.5}}})
    dit, vae = replica_options(args.dit), replica_options(args.vae)
    assert "num_replicas" not in dit and dit["autoscaling_config"]["max_replicas"] == 3
    assert vae["autoscaling_config"]["policy"]["policy_kwargs"] == {"target_fill": 0.5}
    assert args.dit.most_replicas == 3
    assert replica_options(args.text_encoder)["num_replicas"] == 1


def test_only_session_hosts_autoscale_and_bounds_are_checked():
    with pytest.raises(ValueError, match="only dit and vae autoscale"):
        AppArgs.model_validate({"ingress": {"autoscaling": {}}})
    with pytest.raises(ValueError, match="below min_replicas"):
        AutoscalingArgs(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="target_fill"):
        HeldSessionsPolicy(target_fill=0)
