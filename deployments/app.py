"""build_app: binds the serving graph (`import_path: deployments.app:build_app`).

    WorldIngress ──► TextEncoderDeployment  (stateless, any replica)
         ├─────────► VaeDeployment  ┐ SessionAffinityRouter: every call of a session goes to the
         ├─────────► DiTDeployment  ┘ replica that holds it (one GPU, or N with `dit_parallel`)
         ├─────────► SessionParking   sessions between a dropped socket and their resume (one replica)
         ├─────────► WaitingRoom      the line of new sessions waiting for a place (one replica)
         └─────────► WorldHub         the shared worlds: owners publish, viewers' feeds poll (one replica)

No `from __future__ import annotations` here: Serve validates the YAML `args` against the
builder's parameter annotation only when it is the class itself, not a string.

In-place updates: Serve hashes the application's whole `args` into the code version of every
deployment, so a change of any `args` field (placement blocks included) replaces every replica,
the ingress's (and its WebSockets) too. A change of a model deployment's `deployments:` entry
alone (num_replicas, ray_actor_options, ...) reaches only that deployment; the sessions of a
replaced or removed DiT / VAE replica are rebuilt from the ingress's journals (recovery).
"""
from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deployments.autoscaling_policy import HeldSessionsPolicy
from deployments.config import AppArgs, AutoscalingArgs, ReplicaArgs
from deployments.ingress.server import WorldIngress
from deployments.ingress.line.room import WaitingRoom
from deployments.ingress.parking import SessionParking
from deployments.ingress.sharing.hub import WorldHub
from deployments.router import SessionAffinityRouter
from deployments.replicas.dit import DiTDeployment
from deployments.replicas.sp_dit import sp_placement
from deployments.replicas.text_encoder import TextEncoderDeployment
from deployments.replicas.vae import VaeDeployment

PIN_TTL_MARGIN_S = 60.0  # a pin outlives its replica session's idle TTL by this much
# A router counts its own placement as a taken slot until the replicas' stats (pulled every
# routing_stats_period_s, then broadcast by the controller) can list it: a few periods + margin.
STATS_FRESH_PERIODS, STATS_FRESH_MARGIN_S = 3, 2.0


def actor_options(r: ReplicaArgs) -> dict[str, Any]:
    """`ray_actor_options` of one ReplicaArgs block (labels and resources only when set)."""
    options: dict[str, Any] = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus}
    if r.resources:
        options["resources"] = dict(r.resources)
    if r.label_selector:
        options["label_selector"] = dict(r.label_selector)
    return options


def coordinator_options(args: AppArgs) -> dict[str, Any]:
    """`ray_actor_options` of a one-replica coordinator (parking, room, hub): placed like the
    ingress, `coordinator_cpus` reserved."""
    return {**actor_options(args.ingress), "num_cpus": args.coordinator_cpus}


def replica_options(r: ReplicaArgs) -> dict[str, Any]:
    """Serve deployment options of one ReplicaArgs block."""
    count = {"num_replicas": r.num_replicas} if r.autoscaling is None else {
        "autoscaling_config": autoscaling_config(r.autoscaling)}
    return {
        **count,
        "max_ongoing_requests": r.max_ongoing_requests,
        "ray_actor_options": actor_options(r),
        "health_check_period_s": r.health_check_period_s,
        "health_check_timeout_s": r.health_check_timeout_s,
        "graceful_shutdown_timeout_s": r.graceful_shutdown_timeout_s,
    }


def autoscaling_config(a: AutoscalingArgs) -> dict[str, Any]:
    """Serve's autoscaling_config with the held-sessions policy (set in code: Serve cloudpickles
    the policy into its controller, which then needs no import of this package)."""
    return {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "upscale_delay_s": a.upscale_delay_s,
        "downscale_delay_s": a.downscale_delay_s,
        "look_back_period_s": a.look_back_period_s,
        "metrics_interval_s": a.metrics_interval_s,
        "aggregation_function": "max",  # a session that just ended counts for the window
        "policy": {"policy_function": HeldSessionsPolicy, "policy_kwargs": {"target_fill": a.target_fill}},
    }


def session_router(args: AppArgs) -> RequestRouterConfig:
    """The affinity router of the stateful deployments (set in code, never in YAML)."""
    return RequestRouterConfig(
        request_router_class=SessionAffinityRouter,
        request_router_kwargs={"pin_ttl_s": 2 * args.sessions.idle_ttl_s + PIN_TTL_MARGIN_S,
                               "stats_fresh_s": STATS_FRESH_PERIODS * args.sessions.routing_stats_period_s
                               + STATS_FRESH_MARGIN_S},
        request_routing_stats_period_s=args.sessions.routing_stats_period_s,
    )


def bind_dit(args: AppArgs, options: dict[str, Any]) -> Application:
    """The graph's DiT node: DiTDeployment on one GPU, or over `args.dit_parallel` GPUs (its
    engine then spans the ranks of a placement group: deployments/replicas/sp_dit.py).

    `options` are the deployment options build_app gives the DiT (replicas, actor options,
    router); a sequence-parallel replica adds its placement group.
    """
    if args.dit_parallel == 1:
        return DiTDeployment.options(**options).bind(args.model, args.sessions, args.prefix_cache.snapshot_mib,
                                                     store=args.worlds)
    actor = {k: v for k, v in options.get("ray_actor_options", {}).items() if k != "label_selector"}
    options = {**options, "ray_actor_options": actor}  # the bundles carry the labels
    return DiTDeployment.options(**options, **sp_placement(args.dit, args.dit_parallel)).bind(
        args.model, args.sessions, args.prefix_cache.snapshot_mib, args.dit_parallel, args.dit_parallel_timeout_s,
        store=args.worlds)


def build_app(args: AppArgs) -> Application:
    router = session_router(args)
    # A VAE replica may have to hold every session of every DiT replica, and briefly a second
    # incarnation of each: a session replaced while chunks are in flight frees its VAE state
    # once they are answered, after its successor opened (its DiT state goes first).
    vae_capacity = args.sessions.vae_max_sessions or 2 * args.sessions.max_sessions * args.dit.most_replicas
    text = TextEncoderDeployment.options(**replica_options(args.text_encoder)).bind(args.model)
    vae = VaeDeployment.options(**replica_options(args.vae), request_router_config=router).bind(
        args.model, args.sessions, vae_capacity, args.prefix_cache.snapshot_mib, store=args.worlds)
    dit = bind_dit(args, {**replica_options(args.dit), "request_router_config": router})  # 1 or N GPUs
    parking = None
    if args.sessions.resume.grace_s > 0:  # one replica, placed like the ingress (CPU, head node): coordinator_cpus
        parking = SessionParking.options(num_replicas=1, ray_actor_options=coordinator_options(args)).bind(
            vae, dit, args.sessions)
    room = None
    if args.sessions.max_waiting > 0:  # one replica for the application's one line (CPU, head node)
        room = WaitingRoom.options(num_replicas=1, ray_actor_options=coordinator_options(args)).bind(args.sessions)
    hub = None
    if args.sharing.enabled:  # one replica for the application's shared worlds (CPU, head node)
        hub = WorldHub.options(num_replicas=1, ray_actor_options=coordinator_options(args)).bind(args.sharing)
    return WorldIngress.options(**replica_options(args.ingress)).bind(text, vae, dit, parking, args, room, hub)
