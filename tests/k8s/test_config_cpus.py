"""What the app reserves in Ray against the cores of the boxes its configs name (cpus_at_most, and
the graph build_app really binds)."""
from __future__ import annotations

import pytest
from ray.serve.deployment import Deployment

from deployments.config import AppArgs
from deployments.resume_args import ResumeArgs
from serve_graph import IMPORT_PATH, app_args, graph
from support import REPO

DEVICE_CORES = 16  # the lent GPU boxes (H100, H200): benchmarks/gpu_serve.sh's serve runs


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "benchmarks").glob("serve_config.*.yaml")))
def test_every_device_benchmark_config_fits_the_boxs_cores_at_its_most_replicas(name):
    """Ray reserves each replica's num_cpus: a config asking more than the box has leaves a replica
    pending (the autoscaled DiT's second replica on the H200, the bench waiting for it in vain)."""

    args = app_args(f"benchmarks/{name}")
    assert args.cpus_at_most() <= DEVICE_CORES - 1, name  # one core for the proxy, the controller and the bench


def test_the_shipped_gpu_config_fits_the_cores_it_names():
    """serve_config.gpu.yaml's header: one GPU and 8 or more CPU cores."""
    args = app_args("serve_config.gpu.yaml")
    assert args.cpus_at_most() <= 8


def test_cpus_at_most_counts_every_replica_the_app_can_run():
    args = AppArgs.model_validate({
        "dit": {"num_cpus": 4, "autoscaling": {"min_replicas": 1, "max_replicas": 2}},
        "vae": {"num_cpus": 3, "num_replicas": 2}, "text_encoder": {"num_cpus": 2},
        "ingress": {"num_cpus": 1, "num_replicas": 2}, "sessions": {"resume": {"grace_s": 30}},
        "coordinator_cpus": 0.5})
    # + the parking, the waiting room and the world hub: coordinator_cpus each
    assert args.cpus_at_most() == 4 * 2 + 3 * 2 + 2 + 1 * 2 + 3 * 0.5
    no_resume = args.model_copy(update={"sessions": args.sessions.model_copy(update={"resume": ResumeArgs(grace_s=0)})})
    assert no_resume.cpus_at_most() == args.cpus_at_most() - 0.5


def most_replicas(d: Deployment) -> int:
    auto = d._deployment_config.autoscaling_config
    return auto.max_replicas if auto is not None else d.num_replicas


ONE_DEVICE_DIT_CONFIGS = [  # a sequence-parallel DiT's ranks are placement-group bundles, not Serve replicas
    name for name in ["serve_config.yaml", "serve_config.gpu.yaml", "serve_config.h200.yaml",
                      *sorted(f"benchmarks/{p.name}" for p in (REPO / "benchmarks").glob("serve_config.*.yaml"))]
    if app_args(name).dit_parallel == 1]


@pytest.mark.parametrize("name", ONE_DEVICE_DIT_CONFIGS)
def test_cpus_at_most_is_what_the_built_graph_reserves(name):
    """cpus_at_most against the deployments build_app really binds: a deployment it forgets leaves
    the box short (the world hub, placed like the ingress with its 2 CPUs, took an H100 config to
    18 of 16 cores: the ingress was never scheduled and the server never healthy)."""
    args = app_args(name)
    deployments = graph({"import_path": IMPORT_PATH, "args": args.model_dump()})
    reserved = sum(most_replicas(d) * (d.ray_actor_options or {}).get("num_cpus", 1) for d in deployments.values())
    assert reserved == pytest.approx(args.cpus_at_most()), sorted(deployments)
