"""The serve configs' typed args and the graph build_app really binds for them (the config tests'
helpers: test_serve_configs.py, test_config_cpus.py)."""
from __future__ import annotations

import importlib

from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.deployment import Application, Deployment

from deployments.config import AppArgs
from support import REPO

APP_NAME = "lingbot-world"
IMPORT_PATH = "deployments.app:build_app"


def the_app(cfg: dict) -> dict:
    (app,) = cfg["applications"]
    return app


def app_args(name: str) -> AppArgs:
    """The typed args of the one app of the serve config at `name` (relative to the repository;
    an overlay resolved on its base: benchmarks/overlay.py)."""
    from benchmarks.overlay import resolve

    return AppArgs.model_validate(the_app(resolve(REPO / name))["args"])


def builder(import_path: str):
    module_name, attr = import_path.split(":")
    return getattr(importlib.import_module(module_name), attr)


def graph(app_cfg: dict) -> dict[str, Deployment]:
    """The deployments build_app binds for these args, by name.

    Built the way the Serve controller builds it (args validated against the builder's
    annotation, then the builder called); the bound graph is walked through the handles each
    deployment receives in its constructor.
    """
    root = call_user_app_builder_with_args_if_necessary(
        builder(app_cfg["import_path"]), app_cfg["args"]
    )
    found: dict[str, Deployment] = {}
    stack = [root]
    while stack:
        # Application._bound_deployment: the one place Ray 2.60 keeps the bound deployment.
        deployment = stack.pop()._bound_deployment
        found[deployment.name] = deployment
        bound = (*deployment.init_args, *deployment.init_kwargs.values())
        stack += [a for a in bound if isinstance(a, Application)]
    return found


def total(deployments: dict[str, Deployment], resource: str) -> float:
    """What all replicas ask for together (a replica without num_cpus takes 1 CPU)."""
    default = 1 if resource == "num_cpus" else 0
    return sum(
        d.num_replicas * (d.ray_actor_options or {}).get(resource, default)
        for d in deployments.values()
    )
