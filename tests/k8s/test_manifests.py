"""Offline validation of k8s/*.yaml: the RayService against the KubeRay CRD (made strict), the
other kinds against the core schemas the CRD embeds or their known structure, and the references
between the files (Service, ports, labels, the weights volume, what the worker groups can hold).
"""
from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath

import jsonschema
import pytest
import yaml

from deployments.app import actor_options
from deployments.config import AppArgs

KNOWN_KINDS = {
    "RayService": "ray.io/v1",
    "Ingress": "networking.k8s.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PersistentVolumeClaim": "v1",
    "Job": "batch/v1",
    "Secret": "v1",
}
# Deployment name in the graph -> its placement block in AppArgs.
ARGS_KEY = {
    "WorldIngress": "ingress",
    "DiTDeployment": "dit",
    "VaeDeployment": "vae",
    "TextEncoderDeployment": "text_encoder",
}
IMAGE = "lingbot-world-serve:0.1.0"
NGINX = "nginx.ingress.kubernetes.io/"
STREAMING_TIMEOUT_S = 3600
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
METRICS_PORT = 8080


def errors(schema: dict, doc: dict) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]


def sub_schema(schema: dict, *path: str) -> dict:
    """Follow `properties` down a schema; "[]" steps into the items of an array."""
    for key in path:
        schema = schema["items"] if key == "[]" else schema["properties"][key]
    return schema


def pod_template_schema(strict_schema: dict) -> dict:
    """core/v1 PodTemplateSpec, as embedded (and closed) in the RayService CRD."""
    return sub_schema(strict_schema, "spec", "rayClusterConfig", "headGroupSpec", "template")


WEIGHTS_CLAIM = "lingbot-world-weights"
COMPILE_CACHE_CLAIM = "lingbot-world-compile-cache"


def claim(by_kind: dict, name: str) -> dict:
    """The PersistentVolumeClaim called `name` (exactly one)."""
    (pvc,) = [d for d in by_kind["PersistentVolumeClaim"] if d["metadata"]["name"] == name]
    return pvc


def pod_templates(rayservice: dict) -> dict[str, dict]:
    """Pod template of the head ("head") and of each worker group (by group name)."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    templates.update({g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]})
    return templates


def quantity(value) -> float:
    """A Kubernetes count of CPUs or devices ("500m", "12", 1) as a number."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def byte_size(value: str) -> int:
    """An nginx size ("16m", "1g", "512k", "1024") in bytes."""
    match = re.fullmatch(r"(\d+)([kmg]?)", str(value).lower())
    assert match, f"not an nginx size: {value!r}"
    return int(match[1]) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match[2]]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------------------- all documents


def test_every_document_is_a_known_kind_with_a_name(manifests, by_kind):
    for name, docs in manifests.items():
        assert docs, f"{name} is empty"
        for doc in docs:
            kind = doc.get("kind")
            assert kind in KNOWN_KINDS, f"{name}: unexpected kind {kind!r}"
            assert doc.get("apiVersion") == KNOWN_KINDS[kind], f"{name}: apiVersion of {kind}"
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
            body = "stringData" if kind == "Secret" else "spec"
            assert isinstance(doc.get(body), dict), f"{name}: {kind} without its {body}"
    counts = {k: 1 for k in KNOWN_KINDS} | {"PersistentVolumeClaim": 2}  # the weights, the compile cache
    assert {k: len(v) for k, v in by_kind.items()} == counts


# ------------------------------------------------------------------------------- RayService


def test_rayservice_validates_against_the_strict_crd(rayservice, strict_schema):
    assert errors(strict_schema, rayservice) == []


WORKER_0 = ("spec", "rayClusterConfig", "workerGroupSpecs", 0)


@pytest.mark.parametrize(
    "path, good, bad, plain_crd_notices",
    [
        (("spec",), "rayClusterConfig", "rayClusterConfg", True),  # as a missing required key
        (WORKER_0, "maxReplicas", "maxReplica", True),
        (WORKER_0, "rayStartParams", "rayStartParam", False),
        (WORKER_0 + ("template", "spec", "containers", 0), "imagePullPolicy", "imagePulPolicy", False),
    ],
)
def test_strict_crd_reports_misspelled_keys(
    rayservice, crd_schema, strict_schema, path, good, bad, plain_crd_notices
):
    doc = copy.deepcopy(rayservice)
    node = doc
    for key in path:
        node = node[key]
    node[bad] = node.pop(good)
    strict = errors(strict_schema, doc)
    assert any(f"'{bad}' was unexpected" in e for e in strict), strict
    assert bool(errors(crd_schema, doc)) == plain_crd_notices


def test_rayservice_cluster_settings(rayservice, app_args):
    spec = rayservice["spec"]
    assert spec["upgradeStrategy"]["type"] == "NewCluster"
    # Open WebSockets drain from the old cluster for at least one session idle TTL.
    idle_ttl_s = AppArgs.model_validate(app_args).sessions.idle_ttl_s
    assert spec["rayClusterDeletionDelaySeconds"] >= idle_ttl_s
    cluster = spec["rayClusterConfig"]
    assert cluster["rayVersion"].startswith("2.60.")
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    (head_container,) = head["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in head_container["resources"]["limits"]
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_every_ray_pod_runs_the_image_and_mounts_the_weights(rayservice, by_kind, app_args):
    pvc = claim(by_kind, WEIGHTS_CLAIM)
    checkpoint = PurePosixPath(app_args["model"]["checkpoint"])
    for group, template in pod_templates(rayservice).items():
        pod = template["spec"]
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["volumes"]
            if "persistentVolumeClaim" in v
        }
        (container,) = pod["containers"]
        assert container["image"] == IMAGE, group
        mounts = [
            m for m in container["volumeMounts"] if claims.get(m["name"]) == pvc["metadata"]["name"]
        ]
        assert len(mounts) == 1, f"{group}: the weights PVC must be mounted once"
        assert mounts[0]["readOnly"] is True, group
        assert checkpoint.is_relative_to(mounts[0]["mountPath"]), group


def test_api_keys_come_from_a_secret_on_every_ray_pod(rayservice, app_args):
    env_name = AppArgs.model_validate(app_args).auth.api_keys_env
    assert env_name, "the RayService serves with auth on"
    for group, template in pod_templates(rayservice).items():
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        assert "secretKeyRef" in env[env_name]["valueFrom"], group


STORE_SECRET = "lingbot-world-store"


def test_the_world_store_credentials_come_from_its_secret_on_every_ray_pod(rayservice, by_kind, app_args):
    """`args.worlds` keeps worlds and compile artefacts in an S3 bucket; the variables its
    access_key_env / secret_key_env name come from the Secret in k8s/world-store.yaml (its keys),
    optional (no Secret: the S3 client's own chain, e.g. an IAM role), on every Ray pod: the
    ingress and the DiT / VAE replicas all reach the store."""
    worlds = AppArgs.model_validate(app_args).worlds
    assert worlds.backend == "s3" and worlds.bucket and worlds.compile_artifacts
    (secret,) = [d for d in by_kind["Secret"] if d["metadata"]["name"] == STORE_SECRET]
    for group, template in pod_templates(rayservice).items():
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        for name in (worlds.access_key_env, worlds.secret_key_env):
            ref = env[name]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == STORE_SECRET and ref["key"] in secret["stringData"], (group, name)
            assert ref.get("optional") is True, (group, name)
    assert worlds.access_key_env != worlds.secret_key_env


def test_the_secret_manifest_holds_placeholders_not_credentials(by_kind):
    (secret,) = [d for d in by_kind["Secret"] if d["metadata"]["name"] == STORE_SECRET]
    assert secret["type"] == "Opaque" and set(secret["stringData"]) == {"access-key-id", "secret-access-key"}
    assert all(v.startswith("REPLACE-") for v in secret["stringData"].values())


def placements(cfg: dict) -> dict[str, dict]:
    """Per deployment at its largest: replicas, and what each replica asks of a Ray node.

    A `ray_actor_options` in the YAML replaces the code's whole; otherwise the code asks for the
    args' placement (`deployments.app.actor_options`; tests/k8s/test_serve_configs.py checks both
    against the graph). Autoscaled: the YAML's max_replicas, else the args' (`most_replicas`).
    """
    app = cfg["applications"][0]
    args = AppArgs.model_validate(app["args"])
    overrides = {d["name"]: d for d in app.get("deployments", [])}
    out = {}
    for name, key in ARGS_KEY.items():
        replica_args = getattr(args, key)
        over = overrides.get(name, {})
        options = over.get("ray_actor_options", actor_options(replica_args))
        auto = over.get("num_replicas") == "auto"
        out[name] = {
            "replicas": over["autoscaling_config"]["max_replicas"] if auto else replica_args.most_replicas,
            "CPU": options.get("num_cpus", 1),
            "GPU": options.get("num_gpus", 0),
            "labels": options.get("label_selector", {}),
        }
    return out


def test_worker_groups_hold_every_replica_at_its_maximum(rayservice):
    """First-fit decreasing of all replicas (autoscaled to their maximum) onto all pods (at
    maxReplicas), honouring label selectors: each must find a place."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    head_cpus = float(cluster["headGroupSpec"]["rayStartParams"]["num-cpus"])
    pods = [{"CPU": head_cpus, "GPU": 0.0, "labels": {}}]
    for group in cluster["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        for _ in range(group["maxReplicas"]):
            pods.append(
                {
                    "CPU": quantity(limits["cpu"]),
                    "GPU": quantity(limits.get("nvidia.com/gpu", 0)),
                    "labels": group.get("labels", {}),
                }
            )
    wanted = placements(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    replicas = [(name, need) for name, need in wanted.items() for _ in range(need["replicas"])]
    replicas.sort(key=lambda r: (r[1]["GPU"], r[1]["CPU"]), reverse=True)
    for name, need in replicas:
        pod = next(
            (
                p
                for p in pods
                if p["CPU"] >= need["CPU"] - 1e-9
                and p["GPU"] >= need["GPU"] - 1e-9
                and selects(need["labels"], p["labels"])
            ),
            None,
        )
        assert pod is not None, f"no pod has room for a {name} replica: {need}"
        pod["CPU"] -= need["CPU"]
        pod["GPU"] -= need["GPU"]


def test_gpu_deployments_are_pinned_to_worker_groups(rayservice):
    """Each GPU deployment selects an existing worker group by label; the fractions keep one
    DiT and at most one VAE per card."""
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    wanted = placements(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    for name, need in wanted.items():
        if need["GPU"] > 0:
            assert need["labels"], f"{name} uses a GPU but is not pinned to a worker group"
            assert any(selects(need["labels"], g.get("labels", {})) for g in groups), name
    assert 2 * wanted["DiTDeployment"]["GPU"] > 1
    assert 2 * wanted["VaeDeployment"]["GPU"] > 1
    (dit_group,) = [g for g in groups if selects(wanted["DiTDeployment"]["labels"], g.get("labels", {}))]
    assert dit_group["maxReplicas"] >= wanted["DiTDeployment"]["replicas"]


def test_session_hosts_autoscale_by_held_sessions_and_drain(rayservice):
    """The DiT and VAE autoscale through the args (the held-sessions policy set in code), never a
    YAML autoscaling_config (it would replace the policy); the dit-gpu group can hold the DiT at
    its maximum, one replica per pod; a replica being removed has time to finish its chunks."""
    app = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"][0]
    args = AppArgs.model_validate(app["args"])
    overrides = {d["name"]: d for d in app.get("deployments", [])}
    groups = {g["groupName"]: g for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    for name in ("DiTDeployment", "VaeDeployment"):
        replica_args = getattr(args, ARGS_KEY[name])
        assert replica_args.autoscaling is not None, name
        assert not {"autoscaling_config", "num_replicas"} & set(overrides.get(name, {})), name
        assert replica_args.graceful_shutdown_timeout_s >= 30, name
    auto = args.dit.autoscaling
    assert groups["dit-gpu"]["minReplicas"] == auto.min_replicas and groups["dit-gpu"]["maxReplicas"] == auto.max_replicas
    assert args.vae.autoscaling.max_replicas <= groups["codec-gpu"]["maxReplicas"]
    assert args.sessions.vae_max_sessions * args.vae.autoscaling.max_replicas >= (
        args.sessions.max_sessions * auto.max_replicas), "the VAE at its maximum holds every DiT session"


# ------------------------------------------------------------------------------- Ingress


def test_ingress_routes_to_the_serve_service(by_kind, rayservice):
    (ingress,) = by_kind["Ingress"]
    serve_service = rayservice["spec"]["serveService"]
    http = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["http_options"]
    (service_port,) = serve_service["spec"]["ports"]
    assert service_port["targetPort"] == http["port"]
    assert http["host"] == "0.0.0.0"  # reachable through the Service, not only inside the pod

    assert ingress["spec"]["ingressClassName"] == "nginx"
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    for path in paths:
        assert path["pathType"] in ("Prefix", "Exact", "ImplementationSpecific")
        backend = path["backend"]["service"]
        assert backend["name"] == serve_service["metadata"]["name"]
        assert backend["port"]["number"] == service_port["port"]
    assert any(
        p["path"] == "/" and p["pathType"] == "Prefix" for p in paths
    ), "/v1/realtime/world/camera must be routed (a Prefix / path)"
    for tls in ingress["spec"].get("tls", []):
        assert tls["secretName"] and tls["hosts"]


def test_ingress_timeouts_allow_long_streams(by_kind):
    (ingress,) = by_kind["Ingress"]
    notes = ingress["metadata"]["annotations"]
    assert all(isinstance(v, str) for v in notes.values()), "annotation values must be strings"
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[NGINX + key]) >= STREAMING_TIMEOUT_S, key
    assert byte_size(notes[NGINX + "proxy-body-size"]) >= MAX_MESSAGE_BYTES
    assert notes.get(NGINX + "proxy-http-version", "1.1") == "1.1"


# ------------------------------------------------------------------------------- PodMonitor


def test_podmonitor_scrapes_the_metrics_port_of_every_ray_pod(by_kind, rayservice):
    (monitor,) = by_kind["PodMonitor"]
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint.get("path", "/metrics") == "/metrics"
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    assert all(g["rayStartParams"]["metrics-export-port"] == str(METRICS_PORT) for g in groups)
    for group, template in pod_templates(rayservice).items():
        (container,) = template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports.get(endpoint["port"]) == METRICS_PORT, f"{group}: no port {endpoint['port']}"
        # Labels of the pod: the template's plus the node type KubeRay adds.
        labels = {
            **template["metadata"]["labels"],
            "ray.io/node-type": "head" if group == "head" else "worker",
        }
        assert selects(spec["selector"]["matchLabels"], labels), group
        for expr in spec["selector"].get("matchExpressions", []):
            assert expr["operator"] == "In" and labels.get(expr["key"]) in expr["values"], group


# ------------------------------------------------------------------------------- weights


def test_weights_pvc_and_job_match_the_core_schemas(by_kind, strict_schema):
    pvc = claim(by_kind, WEIGHTS_CLAIM)
    (job,) = by_kind["Job"]
    pod_volume = sub_schema(pod_template_schema(strict_schema), "spec", "volumes", "[]")
    pvc_spec = sub_schema(pod_volume, "ephemeral", "volumeClaimTemplate", "spec")
    assert errors(pvc_spec, pvc["spec"]) == []
    assert set(pvc["spec"]["accessModes"]) & {"ReadWriteMany", "ReadOnlyMany"}
    assert errors(pod_template_schema(strict_schema), job["spec"]["template"]) == []
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")


def test_weights_job_fills_the_checkpoint_the_app_loads(by_kind, app_args):
    pvc = claim(by_kind, WEIGHTS_CLAIM)
    (job,) = by_kind["Job"]
    pod = job["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert not mount.get("readOnly", False)
    checkpoint = app_args["model"]["checkpoint"]
    assert PurePosixPath(checkpoint).is_relative_to(mount["mountPath"])
    lines = "\n".join(container["args"]).replace("\\\n", " ").splitlines()
    assert f"root={checkpoint}" in [line.strip() for line in lines]
    for repo, target in (
        ("robbyant/lingbot-world-base-cam", '"$root"'),
        ("robbyant/lingbot-world-fast", '"$root/lingbot_world_fast"'),
    ):
        pattern = rf"hf download {re.escape(repo)}\s.*--local-dir {re.escape(target)}$"
        assert any(re.search(pattern, line.strip()) for line in lines), repo


# ------------------------------------------------------------------------------- compile cache


def test_every_gpu_worker_mounts_the_compile_cache_the_app_names(rayservice, by_kind, app_args, strict_schema):
    """model.compile_cache_dir lies on the compile-cache PVC (k8s/compile-cache.yaml), mounted
    writable by every worker pod that runs a compiling replica (the GPU groups): a restarted or
    autoscaled replica loads its kernels from it (issue 35)."""
    pvc = claim(by_kind, COMPILE_CACHE_CLAIM)
    pod_volume = sub_schema(pod_template_schema(strict_schema), "spec", "volumes", "[]")
    assert errors(sub_schema(pod_volume, "ephemeral", "volumeClaimTemplate", "spec"), pvc["spec"]) == []
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]  # pods on several nodes write it
    directory = PurePosixPath(app_args["model"]["compile_cache_dir"])
    workers = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert workers
    for group in workers:
        pod = group["template"]["spec"]
        names = [v["name"] for v in pod["volumes"]
                 if v.get("persistentVolumeClaim", {}).get("claimName") == COMPILE_CACHE_CLAIM]
        assert len(names) == 1, group["groupName"]
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == names[0]]
        assert not mount.get("readOnly", False), group["groupName"]
        assert directory.is_relative_to(mount["mountPath"]), group["groupName"]
