"""A real multi-node Ray cluster on this machine (issue 17): a head node (ingress, text encoder,
controller, a proxy) and two worker nodes labelled like the KubeRay GPU worker groups
(`lwf-pool=gpu`, a `gpu_slot` resource). `serve deploy` places the DiT and VAE replicas on
the worker nodes only, a proxy runs on every node, and killing a whole worker node (its raylet
and every process under it) mid-session loses nothing: the session continues on the other
worker, its video byte-identical to an uninterrupted run.

The cluster is started with `ray start` (own ports, own temp dir) and stopped by killing the
processes it started, by PID (never `ray stop`: other Ray clusters may run on this machine).
Nodes run as separate raylets on 127.0.0.1; the proxies share the HTTP port (Serve sets
SO_REUSEPORT), so the kernel spreads connections over them: the test finds the proxy a socket
landed on from the proxies' TCP connections.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import websockets
import yaml

from camera import chunk_cameras, translation_scale
from protocol import decode_reply
from protocol.messages import CameraServerConfig, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from support import EXAMPLES, REPO, wait_healthy

BIN = Path(sys.executable).parent
NUM_FRAMES = 45  # 4 chunks: 9 + 12 + 12 + 12 frames
CHUNKS = 4
GPU_LABEL = {"lwf-pool": "gpu"}
HEAD_LABEL = {"lwf-pool": "head"}
# Node death is noticed by the GCS's health checks of the raylets (default 3 s x 5 failures).
FAST_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "1000"}
APP_ARGS = {
    "model": {"preset": "tiny", "default_size": "32*64"},
    "sessions": {"max_sessions": 2, "routing_stats_period_s": 0.5, "recovery_timeout_s": 120},
    "dit": {"num_cpus": 0.1, "label_selector": GPU_LABEL, "resources": {"gpu_slot": 0.25},
            "health_check_period_s": 2},
    "vae": {"num_cpus": 0.1, "label_selector": GPU_LABEL, "resources": {"gpu_slot": 0.25},
            "health_check_period_s": 2},
    "text_encoder": {"num_cpus": 0.1, "label_selector": HEAD_LABEL},
    "ingress": {"num_cpus": 0.1, "max_ongoing_requests": 64, "label_selector": HEAD_LABEL},
    "debug_fields": True,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids() -> set[int]:
    return {int(d) for d in os.listdir("/proc") if d.isdigit()}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def parents() -> dict[int, int]:
    out = {}
    for pid in pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                out[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(roots: set[int]) -> set[int]:
    ppid = parents()
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, pp in ppid.items() if pp in frontier and p not in found}
        found |= frontier
    return {p for p in found if alive(p)}


@dataclass
class Node:
    name: str
    pids: set[int] = field(default_factory=set)  # started by its `ray start` (raylet, agents, GCS ...)

    def processes(self) -> set[int]:
        """Every live process of the node: what `ray start` started and all their descendants."""
        return descendants(self.pids)

    def titles(self) -> list[str]:
        return [cmdline(p).split(" ")[0] for p in self.processes()]

    def kill(self) -> int:
        procs = self.processes()
        for p in procs:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while any(alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(procs)


class LocalCluster:
    """`ray start` head + workers on this machine, own ports and temp dir; ended by PID."""

    def __init__(self) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="lwf17_"))
        self.gcs_port, self.dashboard_port, self.http_port = free_port(), free_port(), free_port()
        self.env = {**os.environ, **FAST_HEALTH, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
                    "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_AUTH_MODE": "disabled"}  # a token file of another cluster must not switch auth on
        self.nodes: dict[str, Node] = {}

    def _start(self, name: str, args: list[str]) -> Node:
        ports = ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                 "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
                 "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port())]
        ports += ["--min-worker-port", "0", "--max-worker-port", "0"]  # workers on ports the OS picks
        before = pids()
        done = subprocess.run([str(BIN / "ray"), "start", "--node-ip-address", "127.0.0.1", "--object-store-memory",
                        str(80 * 1024**2), "--disable-usage-stats", *ports, *args],
                       env=self.env, capture_output=True, text=True, timeout=120)
        node = Node(name)
        assert done.returncode == 0, f"ray start of {name} failed: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        node.pids = {pid for pid in pids() - before if str(self.temp) in cmdline(pid)}
        assert node.pids, f"ray start of {name} started nothing under {self.temp}"
        self.nodes[name] = node
        return node

    def start_head(self) -> Node:
        return self._start("head", [
            "--head", "--port", str(self.gcs_port), "--temp-dir", str(self.temp), "--num-cpus", "2",
            "--labels", ",".join(f"{k}={v}" for k, v in HEAD_LABEL.items()),
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
            "--ray-client-server-port", str(free_port())])

    def start_worker(self, name: str) -> Node:
        return self._start(name, [
            "--address", f"127.0.0.1:{self.gcs_port}", "--temp-dir", str(self.temp), "--num-cpus", "1",
            "--labels", ",".join(f"{k}={v}" for k, v in GPU_LABEL.items()), "--resources", json.dumps({"gpu_slot": 1})])

    def deploy(self, args: dict) -> None:
        config = {"proxy_location": "EveryNode", "http_options": {"host": "127.0.0.1", "port": self.http_port},
                  "applications": [{"name": "lwf", "route_prefix": "/", "import_path": "deployments.app:build_app",
                                    "args": args}]}
        path = self.temp / "serve.yaml"
        path.write_text(yaml.safe_dump(config))
        subprocess.run([str(BIN / "serve"), "deploy", str(path), "-a", f"http://127.0.0.1:{self.dashboard_port}"],
                       env=self.env, check=True, capture_output=True, timeout=120)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_healthy(self, timeout: float = 240) -> None:
        wait_healthy(self.http, timeout)

    def stop(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            if name in self.nodes:
                self.nodes[name].kill()
        shutil.rmtree(self.temp, ignore_errors=True)

    def where(self, title: str) -> dict[str, int]:
        """How many processes titled `title` (e.g. ray::ServeReplica:lwf:DiTDeployment) each node runs.
        While an actor runs a method Ray retitles its process `<title>.<method>` (a replica's health
        check or routing-stats call), so that counts too."""
        return {name: sum(t == title or t.startswith(title + ".") for t in node.titles())
                for name, node in self.nodes.items()}

    def proxy_node_of(self, client_port: int) -> str:
        """The node whose proxy holds the TCP connection from local port `client_port` (`ss`)."""
        out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{self.http_port} )"],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.search(r":(\d+)\s+users:.*pid=(\d+)", line)
            if m and int(m[1]) == client_port:
                pid = int(m[2])
                for name, node in self.nodes.items():
                    if pid in node.processes():
                        return name
        raise AssertionError(f"no proxy holds the connection from port {client_port}: {out}")


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    try:
        c.start_head()
        c.start_worker("worker-a")
        yield c
    finally:
        c.stop()


def until(predicate, timeout: float, what: str, period: float = 0.5):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(period)
    return value


@dataclass(frozen=True)
class Traj:
    image: bytes
    prompt: str
    poses: np.ndarray
    intrinsics: np.ndarray

    def infer(self, sid: str, k: int) -> bytes:
        poses, intrinsics = chunk_cameras(self.poses[:NUM_FRAMES], self.intrinsics[:NUM_FRAMES], k)
        first = SessionStart(self.image, self.prompt, num_frames=NUM_FRAMES,
                             translation_scale=translation_scale(self.poses, NUM_FRAMES)) if k == 0 else None
        return encode(infer_request(sid, poses, intrinsics, start=first, client_chunk_id=k))


@pytest.fixture(scope="module")
def traj() -> Traj:
    ex = EXAMPLES / "00"
    return Traj((ex / "image.jpg").read_bytes(), (ex / "prompt.txt").read_text(encoding="utf-8"),
                np.load(ex / "poses.npy"), np.load(ex / "intrinsics.npy"))


async def open_socket(cluster: LocalCluster, avoid: set[str] = frozenset(), want: str | None = None,
                      tries: int = 40):
    """A WebSocket (after its handshake) and the node of the proxy it landed on."""
    for _ in range(tries):
        ws = await websockets.connect(f"ws://127.0.0.1:{cluster.http_port}/v1/realtime/world/camera", max_size=None)
        port = ws.transport.get_extra_info("sockname")[1]
        config = decode_reply(await asyncio.wait_for(ws.recv(), 60))
        assert isinstance(config, CameraServerConfig), config
        node = cluster.proxy_node_of(port)
        if node not in avoid and (want is None or node == want):
            return ws, node
        await ws.close()
    raise AssertionError(f"no socket landed on a proxy {want or 'outside ' + str(avoid)} in {tries} tries")


async def recv_frame(ws, timeout: float = 180) -> FrameReply:
    reply = decode_reply(await asyncio.wait_for(ws.recv(), timeout))
    assert isinstance(reply, FrameReply), reply
    return reply


async def run_session(ws, traj: Traj, sid: str, chunks: int = CHUNKS) -> list[FrameReply]:
    for k in range(chunks):
        await ws.send(traj.infer(sid, k))
    return [await recv_frame(ws) for _ in range(chunks)]


def video(replies: list[FrameReply]) -> bytes:
    return b"".join(r.video for r in replies)


def test_worker_node_loss_mid_session_loses_nothing(cluster, traj):
    """Placement on the labelled worker nodes, a proxy per node (sessions through the head's
    and a worker's proxy), then the worker holding a session's DiT and VAE killed whole while
    its chunks are in flight: the session ends byte-identical to the uninterrupted run."""
    t0 = time.monotonic()
    cluster.deploy(APP_ARGS)
    cluster.wait_healthy()
    deployed_s = time.monotonic() - t0
    cluster.start_worker("worker-b")  # joins after the deploy: the replicas are all on worker-a
    dit, vae = "ray::ServeReplica:lwf:DiTDeployment", "ray::ServeReplica:lwf:VaeDeployment"
    ingress = "ray::ServeReplica:lwf:WorldIngress"
    assert cluster.where(dit) == {"head": 0, "worker-a": 1, "worker-b": 0}
    assert cluster.where(vae) == {"head": 0, "worker-a": 1, "worker-b": 0}
    assert cluster.where(ingress) == {"head": 1, "worker-a": 0, "worker-b": 0}
    # Serve 2.60 runs EveryNode proxies on the nodes that hold replicas (head and worker-a here).
    proxies = lambda: {name: sum("ProxyActor" in t for t in node.titles()) for name, node in cluster.nodes.items()}
    until(lambda: proxies()["head"] >= 1 and proxies()["worker-a"] >= 1, 120, "a proxy on the head and worker-a")

    async def go():
        ws, node = await open_socket(cluster, want="head")
        reference = await run_session(ws, traj, "reference")
        await ws.close()
        ws_w, worker_proxy = await open_socket(cluster, avoid={"head"})  # a worker node's proxy works too
        through_worker = await run_session(ws_w, traj, "through-worker")
        await ws_w.close()
        assert video(through_worker) == video(reference)

        ws, _ = await open_socket(cluster, avoid={"worker-a"})  # the client's socket survives the loss
        for k in range(2):
            await ws.send(traj.infer("victim", k))
        before = [await recv_frame(ws) for _ in range(2)]
        for k in range(2, CHUNKS):  # pipelined: chunk 2 is in flight when the node dies
            await ws.send(traj.infer("victim", k))
        t_kill = time.monotonic()
        killed = await asyncio.to_thread(cluster.nodes["worker-a"].kill)
        after = [await recv_frame(ws)]
        first_after_s = time.monotonic() - t_kill
        after.append(await recv_frame(ws))
        await ws.close()
        return reference, worker_proxy, before + after, killed, first_after_s

    reference, worker_proxy, victim, killed, first_after_s = asyncio.run(go())
    assert [r.chunk_id for r in victim] == list(range(CHUNKS))
    assert video(victim) == video(reference)  # fMP4 bytes, VAE and muxer state included
    assert victim[-1].debug["recoveries"] >= 2  # DiT and VAE rebuilt
    assert cluster.where(dit)["head"] == 0 and cluster.where(vae)["head"] == 0  # never on the head
    print("RELIABILITY multi-node: replicas after the loss: dit", cluster.where(dit), "vae", cluster.where(vae))
    print(f"RELIABILITY multi-node: deploy {deployed_s:.1f} s; worker-a killed ({killed} processes) with chunk 2 "
          f"in flight; 2 chunks replayed; chunk 2 answered {first_after_s:.1f} s after the kill "
          f"(node death noticed, replicas restarted on worker-b, DiT and VAE rebuilt); "
          f"recoveries {victim[-1].debug['recoveries']}; worker proxy used: {worker_proxy}")
