"""build_app: binds the serving graph (`import_path: deployments.app:build_app`).

    WorldIngress ──► TextEncoder          (stateless, any replica)
         ├─────────► VaeCodec   ┐ SessionAffinityRouter: every call of a session goes to the
         └─────────► CausalDiT  ┘ replica that holds it (one GPU, or N with `dit_parallel`)

No `from __future__ import annotations` here: Serve validates the YAML `args` against the
builder's parameter annotation only when it is the class itself, not a string.
"""
from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deployments.config import AppArgs, ReplicaArgs
from deployments.ingress import WorldIngress
from deployments.router import SessionAffinityRouter
from deployments.sp_dit import bind_dit
from deployments.text_encoder import TextEncoder
from deployments.vae import VaeCodec

PIN_TTL_MARGIN_S = 60.0  # a pin outlives its replica session's idle TTL by this much


def replica_options(r: ReplicaArgs) -> dict[str, Any]:
    """Serve deployment options of one ReplicaArgs block."""
    return {
        "num_replicas": r.num_replicas,
        "max_ongoing_requests": r.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus},
    }


def session_router(args: AppArgs) -> RequestRouterConfig:
    """The affinity router of the stateful deployments (set in code, never in YAML)."""
    return RequestRouterConfig(
        request_router_class=SessionAffinityRouter,
        request_router_kwargs={"pin_ttl_s": 2 * args.sessions.idle_ttl_s + PIN_TTL_MARGIN_S},
        request_routing_stats_period_s=args.sessions.routing_stats_period_s,
    )


def build_app(args: AppArgs) -> Application:
    router = session_router(args)
    # A VAE replica may have to hold every session of every DiT replica.
    vae_capacity = args.sessions.max_sessions * args.dit.num_replicas
    text = TextEncoder.options(**replica_options(args.text_encoder)).bind(args.model)
    vae = VaeCodec.options(**replica_options(args.vae), request_router_config=router).bind(
        args.model, args.sessions, vae_capacity)
    dit = bind_dit(args, {**replica_options(args.dit), "request_router_config": router})  # 1 or N GPUs
    return WorldIngress.options(**replica_options(args.ingress)).bind(text, vae, dit, args)
