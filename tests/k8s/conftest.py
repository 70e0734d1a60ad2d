"""Fixtures of the deployment-material tests: the manifests, the serve configs, the CRD schema."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from support import REPO, SHARED

K8S_DIR = REPO / "k8s"
CRD_FILE = SHARED / "kuberay" / "ray.io_rayservices.yaml"
ROOT_SERVE_CONFIGS = ("serve_config.yaml", "serve_config.gpu.yaml", "serve_config.h200.yaml")
RAYSERVICE_CONFIG = "k8s/rayservice.yaml#serveConfigV2"


def close_objects(schema: dict) -> dict:
    """Add `additionalProperties: false` to every object schema with `properties` (in place).

    Skips schemas that already say something about extra keys, or that keep unknown fields
    (`x-kubernetes-preserve-unknown-fields`). Walks the schema keywords, not every dict, so a
    field that happens to be named "properties" is not mistaken for the keyword.
    """
    if "properties" in schema and "additionalProperties" not in schema and not schema.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        schema["additionalProperties"] = False
    for sub in schema.get("properties", {}).values():
        close_objects(sub)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            close_objects(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []):
            close_objects(sub)
    return schema


def load_documents(path: Path) -> list[dict]:
    with path.open() as f:
        return [d for d in yaml.load_all(f, Loader=yaml.CSafeLoader) if d is not None]


@pytest.fixture(scope="session")
def crd_schema(shared_dir) -> dict:
    """openAPIV3Schema of RayService v1, as the CRD ships it (open objects)."""
    with CRD_FILE.open() as f:
        crd = yaml.load(f, Loader=yaml.CSafeLoader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def strict_schema(crd_schema) -> dict:
    return close_objects(copy.deepcopy(crd_schema))


@pytest.fixture(scope="session")
def manifests() -> dict[str, list[dict]]:
    """Every document of k8s/*.yaml, by file name."""
    files = sorted(K8S_DIR.glob("*.yaml"))
    assert files, f"no manifests in {K8S_DIR}"
    return {f.name: load_documents(f) for f in files}


@pytest.fixture(scope="session")
def by_kind(manifests) -> dict[str, list[dict]]:
    """The same documents, by kind."""
    kinds: dict[str, list[dict]] = {}
    for docs in manifests.values():
        for doc in docs:
            kinds.setdefault(doc.get("kind"), []).append(doc)
    return kinds


@pytest.fixture(scope="session")
def rayservice(by_kind) -> dict:
    (doc,) = by_kind["RayService"]
    return doc


@pytest.fixture(scope="session")
def app_args(rayservice) -> dict:
    """The `args` of the application in the RayService's serveConfigV2."""
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"][0]["args"]


@pytest.fixture(scope="session")
def serve_configs(rayservice) -> dict[str, dict]:
    """The three Serve configs: the RayService's serveConfigV2 and the two at the repo root."""
    configs = {RAYSERVICE_CONFIG: yaml.safe_load(rayservice["spec"]["serveConfigV2"])}
    for name in ROOT_SERVE_CONFIGS:
        configs[name] = yaml.safe_load((REPO / name).read_text())
    return configs


@pytest.fixture(params=[RAYSERVICE_CONFIG, *ROOT_SERVE_CONFIGS])
def serve_config(request, serve_configs) -> tuple[str, dict]:
    """Each Serve config in turn, as (name, parsed config)."""
    return request.param, serve_configs[request.param]
