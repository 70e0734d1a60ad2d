"""One real Ray Serve app for the whole tests/deployments run, and a small WebSocket client.

The app serves the embedded tiny model on CPU with two DiT replicas of two session slots each
(capacity 4: the affinity and admission tests fill it), a short idle TTL (the expiry test waits
it out) and debug fields on (replica ids and recoveries in frame replies). It is deployed as a
config, as `serve deploy` and KubeRay do, so that `redeploy` can update it in place. Ray starts once
(each start costs ~15 s on a 2-core machine), at the first test that asks, and stops after this
folder's last test; the session's other apps go after the last test that uses them (an idle app's
replicas take ~15 % of a core: health checks, routing stats, metrics). A second app in the same Ray instance
(`strict_server`, route prefix /strict, started on first use) has API keys, quotas, tight
connection limits, a 2-chunk cap, recovery out of reach (tiny journal budget), two size
buckets, a small session budget and attention bound.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx
import numpy as np
import pytest
import websockets
from PIL import Image

from camera import chunk_cameras, translation_scale
from media.reassembly import Fmp4Assembler
from protocol import decode_reply
from protocol.messages import CameraServerConfig, FrameReply, ResetOk
from protocol.codec import encode, validated
from protocol.messages import InferRequest, ResetRequest
from seaweed import CREDENTIALS_ENV as S3_CREDENTIALS_ENV
from support import EXAMPLES, wait_healthy
from deployments.replicas.allocator import MALLOC_ENV
from deployments.proxy_guard import PROXY_GUARD_ENV

IDLE_TTL_S = 10.0
TEST_SIZE = "32*64"  # a 16:9 image -> 32 x 48 output: small enough for 1-thread CPU replicas
CAMERA_PATH = "/v1/realtime/world/camera"
NUM_FRAMES = 33  # 3 chunks: 9 + 12 + 12 frames
MESSAGES_PER_S = 400  # per connection; the fuzzer stays below it, the flood test far above
APP_ARGS = {
    "model": {"preset": "tiny", "default_size": TEST_SIZE},
    # Sessions end with their socket here (the drop and release tests); tests/deployments/test_resume.py
    # serves an app that parks them.
    # No waiting room: these apps answer `busy` at once when full (tests/deployments/test_line_e2e.py has one).
    "sessions": {"max_sessions": 2, "idle_ttl_s": IDLE_TTL_S, "routing_stats_period_s": 0.5, "resume": {"grace_s": 0},
                 "max_waiting": 0},
    "dit": {"num_replicas": 2, "num_cpus": 0.1},
    "vae": {"num_cpus": 0.1},
    "text_encoder": {"num_cpus": 0.1},
    "ingress": {"num_cpus": 0.1, "max_ongoing_requests": 64},
    # The fuzzer sends thousands of malformed frames on few sockets: no refused-frames close here.
    "connection": {"max_messages_per_s": MESSAGES_PER_S, "message_burst": MESSAGES_PER_S,
                   "max_refused_frames": 1_000_000},
    "debug_fields": True,
}
API_KEYS_ENV = "LWF_TEST_API_KEYS"  # set before Ray starts: the replicas inherit it (a secret in production)
API_KEYS = ("key-auth", "key-chunks", "key-sessions", "key-limits", "key-caps", "key-hostile", "key-hostile-2",
            "key-sizes", "key-memory", "key-peers", "key-admission", "key-videos", "key-videos-2", "key-prefix",
            "key-prefix-2", "key-share", "key-share-2", "key-steer")
# a key per test group: quotas and connection caps count per key
STRICT_PREFIX = "/strict"
STRICT_ORIGIN = "https://app.example"
STRICT_LIMITS = {"max_messages_per_s": 20, "message_burst": 40, "first_message_timeout_s": 2.0, "idle_timeout_s": 7.0,
                 "max_connections_per_client": 6}
STRICT_CONNECTIONS_PER_KEY = 3
STRICT_MAX_MESSAGE_BYTES = 256 * 1024
STRICT_BUCKETS = ["32*48", "48*32"]
STRICT_MAX_AREA = 4096
STRICT_BUDGET_MIB = 12.0  # one tiny 32x48 session of 2041 frames (8.4 MiB held) fits, two do not
STRICT_ATTENTION_TOKENS = 4096  # 6 tokens per latent frame at 32x48: 682 latent frames
STRICT_ARGS = {
    # Output sizes from two buckets (warmed up in the replicas' constructors), a 4096-pixel cap.
    "model": {"preset": "tiny", "default_size": TEST_SIZE, "size_buckets": STRICT_BUCKETS,
              "max_output_area": STRICT_MAX_AREA},
    # A 2-chunk cap, a 4 s TTL (1 and 2 s expired sessions between two chunks on a loaded
    # 2-core machine: a DiT session idles while the VAE conditions its chunk, once 3.7 s; the
    # connection idle timeout above stays longer than the TTL + a sweep, for the session_lost
    # test), and a journal budget below one decoded image: never recoverable.
    # An explicit 12 MiB session budget and a 4096-token attention bound (admission tests).
    "sessions": {"max_sessions": 4, "idle_ttl_s": 4.0, "routing_stats_period_s": 0.5, "max_chunks": 2,
                 "journal_max_mib": 1.0, "kv_budget_gib": STRICT_BUDGET_MIB / 1024,
                 "max_attention_tokens": STRICT_ATTENTION_TOKENS, "resume": {"grace_s": 0}, "max_waiting": 0},
    "dit": {"num_cpus": 0.1},
    "vae": {"num_cpus": 0.1},
    "text_encoder": {"num_cpus": 0.1},
    "ingress": {"num_cpus": 0.1, "max_ongoing_requests": 32},
    "auth": {"api_keys_env": API_KEYS_ENV, "allowed_origins": [STRICT_ORIGIN], "chunks_per_minute": 8,
             "max_sessions_per_key": 2, "max_connections_per_key": STRICT_CONNECTIONS_PER_KEY},
    "connection": STRICT_LIMITS,
    "max_message_bytes": STRICT_MAX_MESSAGE_BYTES,
    "debug_fields": True,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    http: str  # http://127.0.0.1:PORT
    ws: str  # ws://127.0.0.1:PORT/v1/realtime/world/camera
    headers: dict = field(default_factory=dict)  # an API key where the app needs one (HTTP too)

    def sessions(self) -> dict:
        """The `sessions` block of /v1/models (capacity, held, idle_ttl_s ...)."""
        return httpx.get(f"{self.http}/v1/models", headers=self.headers, timeout=10).json()["data"][0]["sessions"]

    def held(self) -> dict[str, int]:
        """Sessions the VAE and DiT replicas hold (from /healthz)."""
        return httpx.get(f"{self.http}/healthz", headers=self.headers, timeout=10).json()["sessions"]

    def wait_held(self, n: int, timeout: float = 30.0) -> None:
        """Until the VAE and the DiT replicas each hold exactly n sessions (releases run after
        replies, and a cancelled call keeps its replica busy until its thread ends)."""
        deadline = time.monotonic() + timeout
        while (held := self.held()) != {"vae": n, "dit": n}:
            assert time.monotonic() < deadline, f"replicas hold {held} sessions, expected {n} each"
            time.sleep(0.2)


_running: dict[str, Any] = {}  # "ray": the module while Ray runs; "port": Serve's HTTP port
HERE = os.path.dirname(os.path.abspath(__file__))
# session apps (fixture -> app name) deleted after the last test that uses them
SESSION_APPS = {"strict_server": "strict", "resume_server": "resume", "prefix_server": "prefix"}


def _start_ray() -> int:
    import ray
    from ray import serve

    os.environ[API_KEYS_ENV] = ",".join(API_KEYS)
    os.environ.update(S3_CREDENTIALS_ENV)  # the SeaweedFS test server's (any) keys: an S3 world store's replicas
    port = _free_port()
    os.environ.update(MALLOC_ENV)  # as the shipped configs run the Ray processes (see MALLOC_ENV)
    os.environ.update(PROXY_GUARD_ENV)  # the proxy's byte budget per WebSocket (deployments/proxy_guard.py)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    _running["ray"] = ray
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return port


def _stop_ray() -> None:
    ray = _running.pop("ray", None)
    _running.pop("port", None)
    if ray is not None:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_port() -> int:
    """Ray and Serve's HTTP proxy, once per test run (stopped after this folder's last test)."""
    if "port" not in _running:
        try:
            _running["port"] = _start_ray()
        except BaseException:
            _stop_ray()
            raise
    return _running["port"]


def _last_users(session: pytest.Session) -> dict[str, pytest.Item]:
    """Fixture name -> the last test of the run that uses it (directly or through another fixture)."""
    last = getattr(session, "_lwf_last_users", None)
    if last is None:
        last = {name: item for item in session.items for name in SESSION_APPS if name in item.fixturenames}
        session._lwf_last_users = last
    return last


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """After a test's own teardown: delete the session apps it was the last to use, and stop Ray
    when the run leaves this folder (a session fixture would outlive it: the later folders' CPU
    tests would share the 2 cores with every idle replica)."""
    if "ray" not in _running:
        return
    if nextitem is None or not str(nextitem.path).startswith(HERE + os.sep):
        _stop_ray()
        return
    from ray import serve

    for fixture, app in SESSION_APPS.items():
        if _last_users(item.session).get(fixture) is item:
            serve.delete(app)


def _run_app(port: int, args: dict, name: str, prefix: str, headers: Optional[dict] = None) -> Server:
    from ray import serve

    from deployments.app import build_app
    from deployments.config import AppArgs

    serve.run(build_app(AppArgs.model_validate(args)), name=name, route_prefix=prefix, blocking=False)
    base = f"127.0.0.1:{port}{prefix.rstrip('/')}"
    wait_healthy(f"http://{base}")
    return Server(http=f"http://{base}", ws=f"ws://{base}{CAMERA_PATH}", headers=headers or {})


def _apply_config(port: int, args: dict, name: str, prefix: str, deployments: tuple[dict, ...] = ()) -> None:
    """Deploy `name` as a config, as `serve deploy` and KubeRay apply serveConfigV2 (Serve then
    keeps every replica whose own options did not change when only `deployments` changes).
    A config lists every config-deployed app: the others (`_run_app`'s) are left alone, but an
    app applied here under another name would delete `lwf`."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate({
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": name, "route_prefix": prefix, "import_path": "deployments.app:build_app",
                          "args": args, "deployments": list(deployments)}]})
    _get_global_client().deploy_apps(config)


@pytest.fixture(scope="session")
def server(ray_port: int) -> Server:
    """The shared app, deployed as a config (`redeploy` updates it in place)."""
    _apply_config(ray_port, APP_ARGS, "lwf", "/")
    wait_healthy(f"http://127.0.0.1:{ray_port}")
    return Server(http=f"http://127.0.0.1:{ray_port}", ws=f"ws://127.0.0.1:{ray_port}{CAMERA_PATH}")


@pytest.fixture(scope="session")
def extra_app(ray_port: int):
    """`extra_app(name, **overrides)`: another app at /name from APP_ARGS with top-level
    sections merged with `overrides`; returns (Server, connect) where `connect()` opens a
    WebSocket to it. The caller deletes it (`serve.delete(name)`)."""

    def run(name: str, **overrides: dict) -> tuple[Server, Callable[[], Connect]]:
        args = {**APP_ARGS, **{k: {**APP_ARGS.get(k, {}), **v} for k, v in overrides.items()}}
        app = _run_app(ray_port, args, name, f"/{name}")
        return app, lambda: Connect(app.ws, None)

    return run


@pytest.fixture(scope="session")
def strict_server(ray_port: int, server: Server) -> Server:
    """The second app: API keys, quotas, tight connection limits, 2-chunk cap, no recovery."""
    return _run_app(ray_port, STRICT_ARGS, "strict", STRICT_PREFIX, {"Authorization": f"Bearer {API_KEYS[0]}"})


AUTOSCALED_PREFIX = "/auto"
AUTOSCALED_ARGS = {
    # One DiT session slot per replica, 1..2 DiT replicas scaled by the sessions they hold: fast
    # reports (0.5 s), a 1 s look-back and a 2 s downscale delay keep the test short.
    "model": {"preset": "tiny", "default_size": TEST_SIZE},
    "sessions": {"max_sessions": 1, "routing_stats_period_s": 0.5, "retry_after_s": 0.5, "resume": {"grace_s": 0},
                 "max_waiting": 0},
    "dit": {"num_cpus": 0.1, "graceful_shutdown_timeout_s": 5,
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 0, "downscale_delay_s": 2,
                            "look_back_period_s": 1, "metrics_interval_s": 0.5}},
    "vae": {"num_cpus": 0.1},
    "text_encoder": {"num_cpus": 0.1},
    "ingress": {"num_cpus": 0.1, "max_ongoing_requests": 32},
    "debug_fields": True,
}


RESUME_PREFIX = "/resume"
RESUME_GRACE_S = 4.0  # below the idle TTL (10 s): what frees a parked session is the grace period
RESUME_ARGS = {
    # Sessions outlive their socket for RESUME_GRACE_S; two ingress replicas (a resume through
    # the other one), one DiT replica of two slots.
    **APP_ARGS,
    "sessions": {**APP_ARGS["sessions"], "resume": {"grace_s": RESUME_GRACE_S}},
    "dit": {"num_replicas": 1, "num_cpus": 0.1},
    "ingress": {**APP_ARGS["ingress"], "num_replicas": 2},
}


@pytest.fixture(scope="session")
def resume_server(ray_port: int) -> Server:
    """A fourth app (route prefix /resume) whose sessions can be resumed on a new socket."""
    return _run_app(ray_port, RESUME_ARGS, "resume", RESUME_PREFIX)


PREFIX_PREFIX = "/prefix"
PREFIX_MAX_MIB = 1.0  # a few tiny 32x48 sessions of 3 chunks (tests/deployments/test_prefix_cache.py measures one)
PREFIX_SNAPSHOT_MIB = 16.0  # the replicas' snapshots: a few hundred tiny 32x48 sessions' states
PREFIX_ARGS = {
    # The prefix store on (scope principal: API keys on) and the replicas' snapshots, one DiT replica.
    **APP_ARGS,
    "dit": {"num_replicas": 1, "num_cpus": 0.1},
    "auth": {"api_keys_env": API_KEYS_ENV},
    "prefix_cache": {"max_mib": PREFIX_MAX_MIB, "snapshot_mib": PREFIX_SNAPSHOT_MIB},
}


@pytest.fixture(scope="session")
def prefix_server(ray_port: int) -> Server:
    """An app (route prefix /prefix) with the prefix store on and API keys ("key-prefix" in the headers)."""
    return _run_app(ray_port, PREFIX_ARGS, "prefix", PREFIX_PREFIX, {"Authorization": "Bearer key-prefix"})


QUOTA_PREFIX = "/quota"
QUOTA_CHUNKS_PER_MINUTE = 8
QUOTA_ARGS = {
    # API keys with a chunk quota (one 7.5 s token), without the strict app's 2 s / 7 s socket
    # timeouts: a socket may wait for the quota. One DiT replica.
    **APP_ARGS,
    "dit": {"num_replicas": 1, "num_cpus": 0.1},
    "auth": {"api_keys_env": API_KEYS_ENV, "chunks_per_minute": QUOTA_CHUNKS_PER_MINUTE},
}


@pytest.fixture(scope="module")
def quota_server(ray_port: int) -> Iterator[Server]:
    """An app (route prefix /quota, for one module) whose API keys have a chunk quota
    (`auth.chunks_per_minute` 8). Deleted afterwards (the 2-core machine)."""
    from ray import serve

    yield _run_app(ray_port, QUOTA_ARGS, "quota", QUOTA_PREFIX)
    serve.delete("quota")


@pytest.fixture(scope="module")
def quota_connect(quota_server: Server):
    """`async with quota_connect(key) as client:` a WebSocket to the quota app with the key."""
    return lambda key: Connect(quota_server.ws, {"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="session")
def resume_grace_s() -> float:
    return RESUME_GRACE_S


@pytest.fixture(scope="session")
def resume_connect(resume_server: Server):
    """`async with resume_connect() as client:` a fresh WebSocket to the resume app."""
    return lambda headers=None: Connect(resume_server.ws, headers)


@pytest.fixture(scope="module")
def autoscaled_server(ray_port: int) -> Iterator[Server]:
    """A third app (route prefix /auto, for one module): the DiT autoscales by held sessions.
    Deleted afterwards, so that its replicas do not load the 2-core machine for later tests."""
    from ray import serve

    yield _run_app(ray_port, AUTOSCALED_ARGS, "auto", AUTOSCALED_PREFIX)
    serve.delete("auto")


@dataclass(frozen=True)
class Trajectory:
    """Inputs of one example session: image bytes, prompt, poses and intrinsics."""

    image: bytes
    prompt: str
    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [N, 4]
    num_frames: int = NUM_FRAMES

    @property
    def scale(self) -> float:
        return translation_scale(self.poses, self.num_frames)

    def chunk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return chunk_cameras(self.poses[: self.num_frames], self.intrinsics[: self.num_frames], k)

    def image_rgb(self) -> np.ndarray:
        import io

        return np.asarray(Image.open(io.BytesIO(self.image)).convert("RGB"))


@pytest.fixture(scope="session")
def example() -> Trajectory:
    ex = EXAMPLES / "00"
    return Trajectory(
        image=(ex / "image.jpg").read_bytes(),
        prompt=(ex / "prompt.txt").read_text(encoding="utf-8"),
        poses=np.load(ex / "poses.npy"),
        intrinsics=np.load(ex / "intrinsics.npy"),
    )


@dataclass
class Client:
    """A WebSocket client speaking the protocol (replies decoded with the protocol package)."""

    ws: websockets.ClientConnection
    config: CameraServerConfig
    videos: dict[str, Fmp4Assembler] = field(default_factory=dict)
    notices: list = field(default_factory=list)  # session_limit notices (answer no request), as WorldClient

    async def send(self, data: bytes) -> None:
        await self.ws.send(data)

    async def recv(self, timeout: float = 120.0):
        while True:
            reply = decode_reply(await asyncio.wait_for(self.ws.recv(), timeout))
            if not getattr(reply, "is_notice", False):
                break
            self.notices.append(reply)
        if isinstance(reply, FrameReply) and (reply.chunk_id == 0 or reply.session_id in self.videos):
            # (a session resumed on this socket has its start on another)
            self.videos.setdefault(reply.session_id, Fmp4Assembler()).append(reply.video)
        return reply

    async def infer(self, sid: str, traj: Trajectory, k: int, first: bool, **options) -> None:
        """Send chunk k of `traj` (image, prompt and the offline options on the first infer)."""
        poses, intrinsics = traj.chunk(k)
        if first:
            options = {"image": traj.image, "prompt": traj.prompt, "num_frames": traj.num_frames,
                       "translation_scale": traj.scale, **options}
        await self.send(encode(validated(InferRequest, {"session_id": sid, "client_chunk_id": k, **options,
                                                        "cameras": {"poses": poses, "intrinsics": intrinsics}})))

    async def reset(self, sid: str) -> ResetOk:
        await self.send(encode(ResetRequest(session_id=sid)))
        reply = await self.recv()
        assert isinstance(reply, ResetOk), reply
        return reply

    async def run_session(self, sid: str, traj: Trajectory, chunks: int = 3, **options) -> list[FrameReply]:
        """Send every chunk at once (pipelined) and collect the replies in order."""
        for k in range(chunks):
            await self.infer(sid, traj, k, first=k == 0, **options)
        replies = [await self.recv() for _ in range(chunks)]
        for r in replies:
            assert isinstance(r, FrameReply), r
        return replies


class Connect:
    """`async with Connect(url) as client:` opens the socket and reads the handshake."""

    def __init__(self, url: str, headers: Optional[dict] = None, subprotocols: Optional[list[str]] = None) -> None:
        self._url = url
        self._headers = headers
        self._subprotocols = subprotocols

    async def __aenter__(self) -> Client:
        self._ws = await websockets.connect(self._url, max_size=None, additional_headers=self._headers,
                                            subprotocols=self._subprotocols)
        config = decode_reply(await asyncio.wait_for(self._ws.recv(), 30))
        assert isinstance(config, CameraServerConfig), config
        return Client(self._ws, config)

    async def __aexit__(self, *exc) -> None:
        await self._ws.close()


@pytest.fixture(scope="session")
def connect(server: Server):
    """`async with connect() as client:` a fresh WebSocket to the test app."""
    return lambda headers=None: Connect(server.ws, headers)


@pytest.fixture(scope="session")
def connect_url():
    """`async with connect_url(ws_url, headers) as client:` a WebSocket to any app of the run."""
    return lambda url, headers=None: Connect(url, headers)


@pytest.fixture(scope="module")
def autoscaled_connect(autoscaled_server: Server):
    """`async with autoscaled_connect() as client:` a fresh WebSocket to the autoscaled app."""
    return lambda: Connect(autoscaled_server.ws)


@pytest.fixture(scope="session")
def strict_connect(strict_server: Server):
    """`async with strict_connect(key) as client:` a WebSocket to the strict app with
    `Authorization: Bearer <key>` (key None: no header)."""
    def connect(key: Optional[str] = API_KEYS[0], headers: Optional[dict] = None,
                subprotocols: Optional[list[str]] = None) -> Connect:
        auth = {} if key is None else {"Authorization": f"Bearer {key}"}
        return Connect(strict_server.ws, {**auth, **(headers or {})}, subprotocols)

    return connect


@pytest.fixture(scope="session")
def api_keys() -> tuple[str, ...]:
    return API_KEYS


@pytest.fixture(scope="session")
def strict_caps() -> tuple[int, int]:
    """The strict app's connection caps: (per client address, per API key)."""
    return STRICT_LIMITS["max_connections_per_client"], STRICT_CONNECTIONS_PER_KEY


def kill_replica(app: str, deployment: str, replica_id: str) -> None:
    """`ray.kill` the Serve replica actor `replica_id` (the unique id frame replies carry in
    `debug`) of `app`'s `deployment`; the controller then starts a replacement."""
    import ray

    suffix = f"{app}#{deployment}#{replica_id}"
    names = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(suffix)]
    assert len(names) == 1, f"no single replica actor named *{suffix}: {names}"
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)


@pytest.fixture(scope="session")
def replica_killer():
    return kill_replica


def replica_stats(app: str, deployment: str) -> list[dict]:
    """`stats()` of every replica of `app`'s `deployment` (sessions, cache_bytes, rss_bytes ...)."""
    from ray import serve

    return serve.get_deployment_handle(deployment, app_name=app).broadcast("stats").results()


@pytest.fixture(scope="session")
def stats_of(server: Server):
    return replica_stats


def replica_ids(app: str) -> dict[str, set[str]]:
    """The running replicas of each deployment of `app`, by unique id (the controller's view)."""
    from ray.serve.context import _get_global_client

    deployments = _get_global_client().get_serve_details()["applications"][app]["deployments"]
    return {name: {r["replica_id"] for r in d["replicas"] if r["state"] == "RUNNING"}
            for name, d in deployments.items()}


@pytest.fixture(scope="session")
def replicas_of(server: Server):
    return replica_ids


@pytest.fixture(scope="session")
def redeploy(server: Server, ray_port: int):
    """`redeploy(dit_replicas)`: the shared app's config applied again with the same `args` and
    `deployments: [{DiTDeployment, num_replicas}]`: an in-place update of the DiT alone (Serve
    drains the replicas it removes); returns once that many DiT replicas run."""

    def run(dit_replicas: int) -> None:
        _apply_config(ray_port, APP_ARGS, "lwf", "/", ({"name": "DiTDeployment", "num_replicas": dit_replicas},))
        deadline = time.monotonic() + 180
        while len(replica_ids("lwf").get("DiTDeployment", ())) != dit_replicas:
            assert time.monotonic() < deadline, f"DiT not at {dit_replicas} replicas: {replica_ids('lwf')}"
            time.sleep(0.5)
        wait_healthy(server.http)

    return run
