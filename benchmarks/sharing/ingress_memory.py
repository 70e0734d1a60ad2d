"""The resident memory of a Serve application's ingress replicas, on the server's machine.

Their process ids come from Serve's own view of the application (the controller's details,
through the local Ray: `ray.init(address="auto")` when this process is not a driver already);
each one's RSS from /proc (Linux). Replicas on another node are not counted.
"""
from __future__ import annotations

from pathlib import Path

INGRESS = "WorldIngress"


def ingress_pids(app: str) -> list[int]:
    import ray
    from ray.serve.context import _get_global_client

    if not ray.is_initialized():
        ray.init(address="auto", logging_level="ERROR")
    replicas = _get_global_client().get_serve_details()["applications"][app]["deployments"][INGRESS]["replicas"]
    return [int(r["pid"]) for r in replicas if r["state"] == "RUNNING" and r.get("pid")]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def ingress_rss(app: str) -> int:
    """The summed RSS (bytes) of `app`'s running ingress replicas on this machine."""
    return sum(rss_bytes(pid) for pid in ingress_pids(app) if Path(f"/proc/{pid}").exists())
