"""deployments/replicas/sp_dit.py: the N-GPU DiT replica (DiTDeployment holding the SP engine), its
serve config and KubeRay variant, and one real 2-rank replica (gloo on CPU, a real Ray cluster)
against the single-process engine."""
from __future__ import annotations

import copy

import jsonschema
import numpy as np
import pytest
import torch
import yaml
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.deployment import Application
from ray.serve.schema import ServeDeploySchema

from camera import DEFAULT_INTRINSICS_RESOLUTION
from deployments.app import bind_dit, build_app, replica_options
from deployments.config import AppArgs, ModelArgs, ReplicaArgs
from deployments.replicas.dit import DiTDeployment
from deployments.replicas.sp_dit import sp_placement
from deployments.wire import ChunkStep, PastChunk, SessionOptions
from model.config import PRESETS
from model.factory import load_dit_engine
from model.session import DiTSessionSpec
from support import EXAMPLES, REPO, SHARED, rel_err

SP_SERVE_CONFIG = REPO / "serve_config.sp.yaml"
SP4_RAYSERVICE = REPO / "k8s" / "variants" / "rayservice-sp4.yaml"
MAIN_RAYSERVICE = REPO / "k8s" / "rayservice.yaml"
CRD_FILE = SHARED / "kuberay" / "ray.io_rayservices.yaml"
EXACT = 1e-6


def bound(app) -> object:
    """The Deployment an Application binds (Ray 2.60 keeps it in `_bound_deployment`)."""
    return app._bound_deployment


def graph_dit(args: dict) -> object:
    """The DiTDeployment deployment build_app binds for these YAML args (as the controller does)."""
    root = call_user_app_builder_with_args_if_necessary(build_app, args)
    stack, found = [root], {}
    while stack:
        d = bound(stack.pop())
        found[d.name] = d
        stack += [a for a in (*d.init_args, *d.init_kwargs.values()) if isinstance(a, Application)]
    return found["DiTDeployment"]


def the_app(cfg: dict) -> dict:
    (app,) = cfg["applications"]
    return app


def dit_override(app: dict) -> dict:
    (over,) = [d for d in app.get("deployments", []) if d["name"] == "DiTDeployment"]
    return over


def serve_config_of(rayservice: dict) -> dict:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


# ------------------------------------------------------------------------------- binding


def test_bind_dit_gives_an_sp_replica_one_bundle_per_rank_on_one_node():
    args = AppArgs(dit=ReplicaArgs(num_cpus=6, num_gpus=1), dit_parallel=4)
    d = bound(bind_dit(args, replica_options(args.dit)))
    assert d.name == "DiTDeployment" and d.func_or_class is DiTDeployment.func_or_class
    assert d._replica_config.placement_group_bundles == [{"CPU": 6, "GPU": 1}] * 4
    assert d._replica_config.placement_group_strategy == "STRICT_PACK"
    assert d.ray_actor_options["num_gpus"] == 1 and d.ray_actor_options["num_cpus"] == 6  # rank 0 = bundle 0
    assert d.init_args == (args.model, args.sessions, args.prefix_cache.snapshot_mib, 4, args.dit_parallel_timeout_s)


def test_bind_dit_keeps_the_one_device_deployment_for_one_rank():
    args = AppArgs()
    d = bound(bind_dit(args, replica_options(args.dit)))
    assert d.name == "DiTDeployment" and d.func_or_class is DiTDeployment.func_or_class
    assert d._replica_config.placement_group_bundles is None
    assert d.init_args == (args.model, args.sessions, args.prefix_cache.snapshot_mib)


def test_sp_placement_drops_zero_resources_and_needs_some():
    assert sp_placement(ReplicaArgs(num_cpus=0.1), 2)["placement_group_bundles"] == [{"CPU": 0.1}] * 2
    with pytest.raises(ValueError, match="num_cpus or num_gpus"):
        sp_placement(ReplicaArgs(num_cpus=0), 2)


# ------------------------------------------------------------------------------- serve_config.sp.yaml


def test_sp_serve_config_runs_one_4_gpu_dit_replica_on_an_8_gpu_node():
    cfg = yaml.safe_load(SP_SERVE_CONFIG.read_text())
    ServeDeploySchema.model_validate(cfg)
    app = the_app(cfg)
    assert app["import_path"] == "deployments.app:build_app"
    assert "request_timeout_s" not in cfg["http_options"]
    args = AppArgs.model_validate(app["args"])
    assert (args.model.preset, args.model.dtype, args.model.device) == ("lingbot-world-fast", "bfloat16", "cuda")
    assert PRESETS[args.model.preset].dit.num_heads % args.dit_parallel == 0
    d = graph_dit(app["args"])
    assert d.func_or_class is DiTDeployment.func_or_class and d.init_args[3] == args.dit_parallel == 4
    bundles = d._replica_config.placement_group_bundles
    assert len(bundles) == 4 and all(b["GPU"] == 1 for b in bundles)
    assert d._replica_config.placement_group_strategy == "STRICT_PACK"
    others = args.vae.num_replicas * args.vae.num_gpus + args.text_encoder.num_replicas * args.text_encoder.num_gpus
    assert args.dit.num_replicas * sum(b["GPU"] for b in bundles) + others <= 8
    assert args.vae.num_gpus + args.text_encoder.num_gpus <= 1  # VAE and T5 share one card


# ------------------------------------------------------------------------------- k8s variant


@pytest.fixture(scope="module")
def sp4() -> dict:
    (doc,) = [d for d in yaml.safe_load_all(SP4_RAYSERVICE.read_text()) if d]
    return doc


def test_sp4_rayservice_validates_against_the_strict_crd(sp4):
    from k8s.conftest import close_objects  # tests/k8s: the CRD made strict (unknown keys fail)

    crd = yaml.safe_load(CRD_FILE.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = close_objects(copy.deepcopy(v1["schema"]["openAPIV3Schema"]))
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(sp4)]
    assert errors == []
    cfg = serve_config_of(sp4)
    ServeDeploySchema.model_validate(cfg)
    AppArgs.model_validate(the_app(cfg)["args"])


def test_sp4_yaml_restates_the_placement_build_app_sets(sp4):
    app = the_app(serve_config_of(sp4))
    args = AppArgs.model_validate(app["args"])
    code = graph_dit(app["args"])
    assert code.func_or_class is DiTDeployment.func_or_class
    over = dit_override(app)
    assert over["placement_group_bundles"] == code._replica_config.placement_group_bundles
    assert over["placement_group_strategy"] == code._replica_config.placement_group_strategy
    for key in ("num_cpus", "num_gpus"):
        assert over["ray_actor_options"][key] == code.ray_actor_options[key], key
    assert set(code.ray_actor_options) <= set(over["ray_actor_options"])
    first = over["placement_group_bundles"][0]
    assert over["ray_actor_options"]["num_gpus"] <= first["GPU"] and over["ray_actor_options"]["num_cpus"] <= first["CPU"]
    assert "autoscaling_config" not in over and "num_replicas" not in over  # would replace the policy
    scaling = code._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas) == (args.dit.autoscaling.min_replicas,
                                                            args.dit.autoscaling.max_replicas)


def test_sp4_dit_pods_hold_one_replica_each_at_the_maximum(sp4):
    app = the_app(serve_config_of(sp4))
    args = AppArgs.model_validate(app["args"])
    over = dit_override(app)
    groups = sp4["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (selector,) = over["placement_group_bundle_label_selector"]
    (dit_group,) = [g for g in groups if all(g.get("labels", {}).get(k) == v for k, v in selector.items())]
    limits = dit_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    bundles = over["placement_group_bundles"]
    assert args.dit_parallel == 4 == len(bundles)
    assert PRESETS[args.model.preset].dit.num_heads % args.dit_parallel == 0
    assert int(limits["nvidia.com/gpu"]) == sum(b["GPU"] for b in bundles)  # STRICT_PACK: one pod
    assert float(limits["cpu"]) >= sum(b["CPU"] for b in bundles)
    assert dit_group["maxReplicas"] == args.dit.autoscaling.max_replicas
    for g in groups:  # a 4-GPU bundle set fits no other pod
        if g is not dit_group:
            assert int(g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)) < 4


def test_sp4_differs_from_the_main_rayservice_only_in_the_dit_parts(sp4):
    (main,) = [d for d in yaml.safe_load_all(MAIN_RAYSERVICE.read_text()) if d]
    assert sp4["metadata"] == main["metadata"]  # applied instead of it, never beside it
    for key in ("upgradeStrategy", "rayClusterDeletionDelaySeconds", "serveService"):
        assert sp4["spec"][key] == main["spec"][key], key
    cluster, main_cluster = sp4["spec"]["rayClusterConfig"], main["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"] == main_cluster["headGroupSpec"]
    others = [g for g in cluster["workerGroupSpecs"] if g["groupName"] != "dit-gpu"]
    assert others == [g for g in main_cluster["workerGroupSpecs"] if g["groupName"] != "dit-gpu"]
    cfg, main_cfg = serve_config_of(sp4), serve_config_of(main)
    args, main_args = the_app(cfg)["args"], the_app(main_cfg)["args"]
    assert {k: v for k, v in args.items() if k not in ("dit", "dit_parallel", "sessions")} == {
        k: v for k, v in main_args.items() if k not in ("dit", "sessions")}
    assert cfg["http_options"] == main_cfg["http_options"]


# ------------------------------------------------------------------------------- a real replica


@pytest.fixture(scope="module")
def serve_instance():
    """Serve on the session's Ray cluster when one runs (tests/deployments/conftest.py), else on
    one started here (no HTTP proxy) and shut down afterwards."""
    import ray
    from ray import serve

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(proxy_location="Disabled")
    try:
        yield serve
    finally:
        if started:
            serve.shutdown()
            ray.shutdown()


def test_two_rank_replica_matches_the_single_process_engine(serve_instance):
    """DiTDeployment over 2 ranks (rank 0 the replica, rank 1 an actor in its placement group,
    gloo) streams two chunks of a 45-token-per-chunk session (padding) equal to DiTEngine."""
    serve = serve_instance
    args = AppArgs(model=ModelArgs(preset="tiny"), dit=ReplicaArgs(num_cpus=0.1), dit_parallel=2)
    height, width, seed = 48, 80, 5  # latent 6 x 10: 45 tokens per chunk
    gen = torch.Generator().manual_seed(1)
    context = torch.randn(9, PRESETS["tiny"].dit.text_dim, generator=gen)
    ys = [torch.randn(20, 3, height // 8, width // 8, generator=gen) for _ in range(2)]
    poses, intrinsics = np.load(EXAMPLES / "00" / "poses.npy"), np.load(EXAMPLES / "00" / "intrinsics.npy")
    cams = [(poses[12 * c : 12 * c + 12], intrinsics[12 * c : 12 * c + 12]) for c in range(2)]

    handle = serve.run(bind_dit(args, replica_options(args.dit)), name="sp-dit-test", route_prefix=None)
    try:
        options = SessionOptions("s", "p", "d", (height, width), seed, None, None, DEFAULT_INTRINSICS_RESOLUTION)
        handle.open.remote("s", options, context.numpy()).result()
        outs = [handle.step.remote("s", ChunkStep(ys[c].numpy(), *cams[c])).result() for c in range(2)]
        stats = handle.stats.remote().result()
        assert handle.close.remote("s").result() is True
    finally:
        serve.delete("sp-dit-test")

    engine = load_dit_engine("tiny", None, "float32", "cpu")
    session = engine.open(DiTSessionSpec(context=context, height=height, width=width, seed=seed))
    refs = [engine.step(session, ys[c], *cams[c]).latents for c in range(2)]
    errors = [rel_err(o.latents, r) for o, r in zip(outs, refs)]
    print("2-rank replica vs single process, rel err per chunk:", errors)
    assert max(errors) <= EXACT
    assert stats["sessions"] == 1


def test_two_rank_replica_answers_prompt_update_unsupported_and_keeps_the_session(serve_instance):
    """docs/SERVING.md: the sequence-parallel DiT refuses `prompt_update` (`bad_message`): a step
    with a context on a 2-rank replica raises `Unsupported` (not a TypeError), and the session
    goes on as before."""
    from deployments.errors import Unsupported
    from protocol.errors import ErrorCode

    serve = serve_instance
    args = AppArgs(model=ModelArgs(preset="tiny"), dit=ReplicaArgs(num_cpus=0.1), dit_parallel=2)
    height, width = 32, 48
    gen = torch.Generator().manual_seed(3)
    context = torch.randn(9, PRESETS["tiny"].dit.text_dim, generator=gen).numpy()
    y = torch.randn(20, 3, height // 8, width // 8, generator=gen).numpy()
    poses, intrinsics = np.load(EXAMPLES / "00" / "poses.npy")[:12], np.load(EXAMPLES / "00" / "intrinsics.npy")[:12]

    handle = serve.run(bind_dit(args, replica_options(args.dit)), name="sp-dit-steer", route_prefix=None)
    try:
        options = SessionOptions("s", "p", "d", (height, width), 1, None, None, DEFAULT_INTRINSICS_RESOLUTION)
        handle.open.remote("s", options, context).result()
        with pytest.raises(Unsupported, match="prompt_update") as refused:
            handle.step.remote("s", ChunkStep(y, poses, intrinsics, context)).result()
        assert refused.value.code is ErrorCode.BAD_MESSAGE
        out = handle.step.remote("s", ChunkStep(y, poses, intrinsics)).result()  # the session is intact
        assert out.latents.shape == (16, 3, height // 8, width // 8)
        assert handle.close.remote("s").result() is True
    finally:
        serve.delete("sp-dit-steer")


def test_two_rank_replica_restores_bit_for_bit_and_breaks_at_once_when_a_rank_dies(serve_instance):
    """`restore` on the 2-rank replica continues a journaled session bit for bit; a killed rank
    breaks the replica at once (its sessions answer session_lost, opens `busy`), Serve replaces
    it, and the session is rebuilt on the new replica, still bit for bit."""
    import time

    import ray

    from deployments.errors import Busy, SessionLost
    from deployments.replicas.sp_dit import RANK_NAMESPACE

    serve = serve_instance
    args = AppArgs(model=ModelArgs(preset="tiny"), dit_parallel=2, dit_parallel_timeout_s=20,
                   dit=ReplicaArgs(num_cpus=0.1, health_check_period_s=1, health_check_timeout_s=5))
    height, width = 32, 64  # latent 4 x 8: 8 tokens per frame
    gen = torch.Generator().manual_seed(2)
    context = torch.randn(9, PRESETS["tiny"].dit.text_dim, generator=gen)
    ys = [torch.randn(20, 3, height // 8, width // 8, generator=gen).numpy() for _ in range(4)]
    poses, intrinsics = np.load(EXAMPLES / "00" / "poses.npy"), np.load(EXAMPLES / "00" / "intrinsics.npy")
    cams = [(poses[12 * c : 12 * c + 12], intrinsics[12 * c : 12 * c + 12]) for c in range(4)]
    options = SessionOptions("s", "p", "d", (height, width), 3, None, None, DEFAULT_INTRINSICS_RESOLUTION)
    spec = (options, context.numpy())

    def past(outs, n):
        return [PastChunk(*cams[c], ys[c], outs[c].latents) for c in range(n)]

    handle = serve.run(bind_dit(args, replica_options(args.dit)), name="sp-dit-restore", route_prefix=None)
    try:
        handle.open.remote("a", *spec).result()
        ref = [handle.step.remote("a", ChunkStep(ys[c], *cams[c])).result() for c in range(4)]
        handle.restore.remote("b", *spec, past(ref, 2), ref[1].noise).result()
        rebuilt = handle.step.remote("b", ChunkStep(ys[2], *cams[2])).result()
        assert np.array_equal(rebuilt.latents, ref[2].latents)
        stats = handle.stats.remote().result()
        assert stats["sessions"] == 2

        ray.kill(ray.get_actor(stats["ranks"][0], namespace=RANK_NAMESPACE))
        t0 = time.monotonic()
        with pytest.raises(SessionLost):
            handle.step.remote("b", ChunkStep(ys[3], *cams[3])).result()
        lost_s = time.monotonic() - t0
        with pytest.raises((Busy, SessionLost)):  # broken: refuses, or already replaced
            handle.restore.remote("c", *spec, past(ref, 3), ref[2].noise).result()

        deadline = time.monotonic() + 120
        while True:  # Serve replaces the unhealthy replica
            try:
                handle.restore.remote("c", *spec, past(ref, 3), ref[2].noise).result()
                break
            except Busy:
                assert time.monotonic() < deadline, "the broken replica was not replaced"
                time.sleep(1)
        replaced_s = time.monotonic() - t0
        again = handle.step.remote("c", ChunkStep(ys[3], *cams[3])).result()
        assert again.replica != ref[0].replica
        assert np.array_equal(again.latents, ref[3].latents)
        print(f"rank killed: session_lost after {lost_s:.2f} s, rebuilt on a new replica after {replaced_s:.1f} s")
        assert lost_s < 10
    finally:
        serve.delete("sp-dit-restore")
