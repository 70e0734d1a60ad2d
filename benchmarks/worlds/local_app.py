"""The CPU runs of the world and sharing benchmarks: serve_config.yaml's app in a Ray of its own.

    python -m benchmarks.worlds.local_app --set ingress.num_replicas=2 --pass-app \\
        benchmarks.sharing.watch_load --viewers 1 50 200 --out watch_load.json

Starts a local Ray (its own instance, `num_cpus` 4 as the tests' app, no dashboard) and Serve on
a free port, deploys the first application of `--config` (default serve_config.yaml: the
embedded tiny model on the CPU, its world store on) with `--set SECTION.FIELD=VALUE` overrides
(YAML values), waits for /healthz, then runs the benchmark module's `main` with `--url` of this
app added to its arguments (and with `--pass-app`, `--app` and the application's name), and
shuts everything down. The world store's folder is `--worlds-root` (default: a fresh temporary
folder, deleted after). SIGTERM shuts them down as the end does.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from typing import Optional

import yaml

CAMERA_PATH = "/v1/realtime/world/camera"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_args(config: str, sets: list[str], worlds_root: str) -> tuple[str, dict]:
    app = yaml.safe_load(open(config))["applications"][0]
    args = app["args"]
    args.setdefault("worlds", {}).update({"enabled": True, "root": worlds_root})
    for s in sets:
        path, value = s.split("=", 1)
        *parents, leaf = path.split(".")
        node = args
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    return app["name"], args


def wait_healthy(http: str, timeout_s: float = 300.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(f"{http}/healthz", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1.0)
    raise SystemExit(f"{http} not healthy in {timeout_s} s")


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="serve_config.yaml")
    p.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE of the app's args")
    p.add_argument("--worlds-root")
    p.add_argument("--pass-app", action="store_true", help="add --app NAME (watch_load: its ingress replicas' memory)")
    p.add_argument("module", help="the benchmark module, e.g. benchmarks.sharing.watch_load")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: Serve and Ray shut down (finally)
    import ray
    from ray import serve

    from deployments.app import build_app
    from deployments.config import AppArgs

    with tempfile.TemporaryDirectory(prefix="lwf-bench-worlds-") as tmp:
        name, args = app_args(a.config, a.set, a.worlds_root or tmp)
        port = free_port()
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_app(AppArgs.model_validate(args)), name=name, route_prefix="/", blocking=False)
            print(f"healthy in {wait_healthy(f'http://127.0.0.1:{port}'):.1f} s", flush=True)
            rest = [x for x in a.rest if x != "--"] + ["--url", f"ws://127.0.0.1:{port}{CAMERA_PATH}"]
            if a.pass_app:
                rest += ["--app", name]
            importlib.import_module(a.module).main(rest)
        finally:
            serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    main()
