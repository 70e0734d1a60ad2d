"""The resident memory of a Serve application's ingress replicas, on the server's machine.

Read from /proc (Linux) without joining any Ray cluster: the replicas are the processes named
`ray::ServeReplica:<app>:WorldIngress` (`.<method>` after it while a call runs: Ray sets the
process title) that descend from `root` (the process that started the
local Ray: `serve run`'s, or this one when it is the driver, as in the tests and
benchmarks/worlds/local_app.py). Other Ray instances on the machine (another `serve run`,
another engineer's tests) are not counted. Replicas on another node are not counted.
"""
from __future__ import annotations

import os
from pathlib import Path

INGRESS = "WorldIngress"
PROC = Path("/proc")


def _parent(pid: int) -> int:
    stat = (PROC / str(pid) / "stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # after the command's name: state, ppid


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = _parent(pid)
    return False


def ingress_pids(app: str, root: int) -> list[int]:
    name = f"ray::ServeReplica:{app}:{INGRESS}".encode()
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].strip()
            if (title == name or title.startswith(name + b".")) and _descends(int(entry.name), root):
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return pids


def rss_bytes(pid: int) -> int:
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def ingress_rss(app: str, root: int | None = None) -> tuple[int, int]:
    """(summed RSS in bytes, replicas counted) of `app`'s ingress replicas under `root` (default: this process)."""
    pids = ingress_pids(app, os.getpid() if root is None else root)
    if not pids:
        raise LookupError(f"no {INGRESS} replica of {app!r} under process {root or os.getpid()}")
    return sum(rss_bytes(p) for p in pids), len(pids)
