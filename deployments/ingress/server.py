"""WorldIngress: the FastAPI app of the graph (WebSocket, health, model card, web page, videos).

The camera route and `POST /v1/videos` both serve a `Connection` (`_serve`): over the
WebSocket, or over an in-process transport driven by the videos' session runner.

No `from __future__ import annotations`: FastAPI must see the real `WebSocket` annotation of
the route methods that `serve.ingress` rewrites, or it treats `ws` as a query parameter.
"""

import asyncio
from urllib.parse import quote
from dataclasses import asdict
from pathlib import PurePosixPath
from typing import Any, Optional

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from camera import parse_size
from deployments.ingress.guards.admission import Admission
from deployments.ingress.guards.auth import Auth
from deployments.ingress.peers import CLIP_MODE, PeerTransport
from deployments.config import AppArgs
from deployments.ingress.connection import POLICY_VIOLATION, Backends, Connection
from deployments.ingress.guards.connection_caps import ConnectionCaps
from deployments.ingress.detached import running as detached_running
from deployments.ingress.detached import settle
from deployments.ingress.health import PathProbe, line_lost
from deployments.ingress.ready import announce_when_ready
from deployments.log import get_log, log_routine_access_at_debug
from deployments.metrics import IngressMetrics, PrefixMetrics
from deployments.ingress.prefix.keys import model_fingerprint
from deployments.ingress.prefix.store import PrefixStore
from deployments.ingress.guards.quotas import Quotas
from deployments.ingress.sharing.owner import WATCH_ROUTE
from deployments.ingress.sharing.viewer import Viewers
from deployments.ingress.transport import Transport
from deployments.ingress.videos import ROUTE as VIDEOS_ROUTE
from deployments.ingress.videos import VideoEndpoint
from deployments.ingress.videos.runner import SessionRunner
from deployments.ingress.videos.schema import openapi_extra as video_body_schema
from deployments.ingress.web import mount_web
from deployments.ingress.worlds.keeping import open_keeping
from deployments.ingress.worlds.routes import WorldRoutes
from protocol.limits import Limits
from protocol.messages import CameraServerConfig
from deployments.ingress.signposts import CAMERA_ROUTE, answer_wrong_socket, install_signposts
from deployments.ingress.sizes import SizeRule

OPENPI_ROUTE = "/"  # openpi clients connect to the server's root WebSocket
WORLDS_ROUTE = "/v1/worlds"
HEALTH_TIMEOUT_S = 10.0
LINE_STATS_TIMEOUT_S = 2.0
REFERENCE_ASPECT = (9, 16)  # the handshake's image_resolution is for a 16:9 image
INGRESS_HTTP_HEADROOM = 8  # ongoing requests of an ingress replica kept free of WebSockets (health, HTTP)


def _replica_id() -> str:
    """This ingress replica's unique id (debug fields), "" outside a replica."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not in a replica (tests that build the class directly)
        return ""


def own_max_ongoing_requests() -> int:
    """This replica's `max_ongoing_requests` (each open WebSocket is one ongoing request).
    Read from the replica context (a `deployments:` entry of the config may override
    `args.ingress`); the AppArgs default where Serve does not expose it."""
    try:
        return int(serve.get_replica_context()._deployment_config.max_ongoing_requests)
    except Exception:  # noqa: BLE001 - private field of Ray 2.60; fall back to the configured default
        return AppArgs().ingress.max_ongoing_requests


VIDEO_PIPELINE = 2  # a video's chunk k+1 DiT step overlaps chunk k's decode

# The API docs are served by the ingress itself (below), behind the API key when auth is on.
app = FastAPI(title="lingbot-world-serve", docs_url=None, redoc_url=None, openapi_url=None)
mount_web(app)  # the browser client at / (the `web` package's files)
install_signposts(app)  # unknown routes and wrong methods name the right one (before serve.ingress copies the app)


@serve.deployment
@serve.ingress(app)
class WorldIngress:
    """Holds the handles of the graph; one `Connection` per WebSocket."""

    def __init__(self, text: DeploymentHandle, vae: DeploymentHandle, dit: DeploymentHandle,
                 parking: Optional[DeploymentHandle], args: AppArgs, room: Optional[DeploymentHandle] = None,
                 hub: Optional[DeploymentHandle] = None) -> None:
        """`parking`: SessionParking (sessions resumable after a dropped socket), or None;
        `room`: the WaitingRoom (new sessions wait in line for a place), or None; `hub`: the
        WorldHub (shared worlds, sharing/hub.py), or None."""
        log_routine_access_at_debug()
        self._backends = Backends(text=text, vae=vae, dit=dit, parking=parking, room=room, hub=hub)
        self._args = args
        m = args.model
        self._limits = Limits(max_message_bytes=args.max_message_bytes, max_num_frames=args.sessions.max_frames,
                              max_output_area=m.max_output_area, max_aspect_ratio=m.max_aspect_ratio)
        sizes = SizeRule(tuple(m.bucket_sizes()), m.max_output_area)
        self._handshake = CameraServerConfig(
            model=m.preset,
            image_resolution=sizes.output(parse_size(m.default_size), *REFERENCE_ASPECT),
            default_size=m.default_size,
            max_message_bytes=args.max_message_bytes,
            max_output_area=m.max_output_area,
            random_weights=m.weights_are_random(),
            checkpoint=None if m.checkpoint is None else PurePosixPath(m.checkpoint).name,
            size_buckets=tuple(m.bucket_sizes()) or None,
            max_chunks=args.sessions.max_chunks,
            window=None if m.local_attn_size == -1 else (m.local_attn_size, m.sink_size),
            resume_grace_s=args.sessions.resume.grace_s if parking is not None else None,  # bound when > 0
            min_fps=args.sessions.min_fps,  # the DiT replicas' floor (replicas/frame_floor.py)
            debug={"ingress_replica": _replica_id()} if args.debug_fields else None,
        )
        self._auth = Auth(args.auth)
        self._quotas = Quotas(args.auth)
        self._metrics = IngressMetrics()
        self._prefix = None  # (store, model fingerprint, metrics): exact-prefix reuse (ingress/prefix/)
        if args.prefix_cache.enabled:
            prefix_metrics = PrefixMetrics()
            self._prefix = (PrefixStore(int(args.prefix_cache.max_mib * 1024 * 1024), prefix_metrics),
                            model_fingerprint(args), prefix_metrics)
        c = args.connection
        total = c.max_connections or max(1, own_max_ongoing_requests() - INGRESS_HTTP_HEADROOM)
        self._caps = ConnectionCaps(total, c.max_connections_per_client,
                                    args.auth.max_connections_per_key if self._auth.enabled else None,
                                    c.reserved_for_new_clients)
        self._admission = Admission(self._auth, self._caps, self._metrics, c.trust_forwarded_for,
                                    args.sessions.retry_after_s)  # every socket route's (guards/admission.py)
        self._viewers = None if hub is None else Viewers(hub, self._admission, args, self._limits, self._metrics,
                                                         self._handshake.debug)  # the watch route (sharing/viewer.py)
        self._probe = PathProbe(self._backends, HEALTH_TIMEOUT_S)
        # None: worlds off; in a Serve replica, the retention sweeps (worlds/retention.py) start
        self._worlds = open_keeping(args, get_log("ingress", replica=_replica_id()), sweeps=bool(_replica_id()))
        self._world_routes = WorldRoutes(self._worlds, self._auth, args.connection.trust_forwarded_for)
        if _replica_id():  # in a Serve replica (not a test building the class): say where to go once up
            self._ready = asyncio.get_running_loop().create_task(
                announce_when_ready(self._probe, CAMERA_ROUTE, get_log("ingress", replica=_replica_id())))
        self._open_connections = 0
        runner = SessionRunner(self._serve, min(VIDEO_PIPELINE, args.sessions.max_pending_chunks),
                               args.videos.busy_timeout_s)
        self._videos = VideoEndpoint(args.videos, self._auth, self._limits, runner, args.sessions.retry_after_s,
                                     args.connection.trust_forwarded_for)

    @app.websocket(CAMERA_ROUTE)
    @app.websocket(CAMERA_ROUTE + "/")  # clients that join a base URL and the path with a slash
    async def camera(self, ws: WebSocket) -> None:
        await self._socket(ws, ws.query_params.get("mode"), one_reply=False)

    @app.websocket(OPENPI_ROUTE)
    async def openpi(self, ws: WebSocket) -> None:
        """Where openpi's `WebsocketClientPolicy(host, port)` connects (`ws://host:port`, no
        path): the clip mode with one reply per request, the whole clip's frames, because its
        `infer()` sends one message and reads one (docs/COMPATIBILITY.md)."""
        await self._socket(ws, CLIP_MODE, one_reply=True)

    @app.websocket(WATCH_ROUTE)
    async def watch(self, ws: WebSocket) -> None:
        """A viewer of a shared world (PROTOCOL.md "Shared worlds", sharing/viewer.py)."""
        if self._viewers is None:
            await ws.close(code=POLICY_VIOLATION, reason="this server does not share worlds")
            return
        await self._viewers.serve(ws)

    async def _socket(self, ws: WebSocket, mode: Optional[str], one_reply: bool) -> None:
        admitted = await self._admission.admit(ws)  # origin, API key, connection caps (guards/admission.py)
        if admitted is None:
            return
        key_id, client = admitted.key_id, admitted.client
        # Our protocol, or the peers' clip mode (deployments/clip), chosen by the first request
        # or by `?mode=clip|chunk`.
        peer = PeerTransport(ws, self._limits, min(VIDEO_PIPELINE, self._args.sessions.max_pending_chunks),
                             mode, resumable=self._handshake.resume_grace_s is not None, one_reply=one_reply)
        try:
            await self._serve(peer, key_id, client, resumable=True)
        finally:
            peer.stop()
            self._admission.release(admitted)

    async def _serve(self, transport: Transport, key_id: Optional[str], client: Optional[str] = None,
                     resumable: bool = False) -> None:
        """One `Connection` on an accepted transport, counting against `key_id`'s quotas;
        `resumable`: its open session is parked when it ends (a WebSocket, not a video)."""
        self._open_connections += 1
        self._metrics.connections.set(self._open_connections)
        try:
            await Connection(transport, self._backends, self._args, self._limits, self._handshake, self._metrics,
                             self._quotas.for_key(key_id), key_id, client, resumable, self._prefix,
                             self._worlds).run()
        finally:
            self._open_connections -= 1
            self._metrics.connections.set(self._open_connections)

    # The body is read and parsed by the endpoint (byte cap, bounded parse); its schema is documented.
    @app.post(VIDEOS_ROUTE, response_class=Response, openapi_extra=video_body_schema())
    async def create_video(self, request: Request) -> Response:
        """A whole trajectory -> one MP4, or a job with `?async=true` (deployments/videos, docs/VIDEOS.md)."""
        return await self._videos.create(request)

    @app.get(VIDEOS_ROUTE + "/{job_id}")
    async def video_status(self, job_id: str, request: Request) -> JSONResponse:
        """The caller's job: status and progress (404 for another principal's job)."""
        return self._videos.status(job_id, request)

    @app.get(VIDEOS_ROUTE + "/{job_id}/content", response_class=Response)
    async def video_content(self, job_id: str, request: Request) -> Response:
        """The caller's finished job's MP4."""
        return self._videos.content(job_id, request)

    @app.delete(VIDEOS_ROUTE + "/{job_id}")
    async def delete_video(self, job_id: str, request: Request) -> JSONResponse:
        """Cancel (if unfinished) and drop the caller's job; its session is released."""
        return await self._videos.delete(job_id, request)

    @app.get(WORLDS_ROUTE)
    async def list_worlds(self, request: Request) -> Response:
        """The caller's worlds (worlds/routes.py, docs/WORLDS.md)."""
        return await self._world_routes.list(request)

    @app.post(WORLDS_ROUTE + "/import")
    async def import_world(self, request: Request) -> Response:
        """A `.lwf` file (application/octet-stream) as a new world of the caller's."""
        return await self._world_routes.import_(request)

    @app.delete(WORLDS_ROUTE + "/{world_id}")
    async def delete_world(self, world_id: str, request: Request) -> Response:
        return await self._world_routes.delete(world_id, request)

    @app.get(WORLDS_ROUTE + "/{world_id}/video", response_class=Response)
    async def world_video(self, world_id: str, request: Request) -> Response:
        """The world's MP4 so far: the init segment and every stored chunk's fragment."""
        return await self._world_routes.video(world_id, request)

    @app.get(WORLDS_ROUTE + "/{world_id}/export", response_class=Response)
    async def export_world(self, world_id: str, request: Request) -> Response:
        """The world as one `.lwf` file."""
        return await self._world_routes.export(world_id, request)

    @app.get("/healthz")
    async def healthz(self, request: Request) -> JSONResponse:
        """200 when a session could be served: every replica answers its stats, and one call
        routed to each deployment the way a session's calls go (through the session-affinity
        router) comes back within the deadline; else 503. Status `degraded` (still 200) while the
        waiting room does not answer (health.py) or the world store is down or behind (worlds/). With auth on, the counts (replicas, sessions,
        connections) only for a valid key."""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S + 1.0):
                stats, probe, line = await asyncio.gather(self._replica_stats(), self._probe.run(), self._line())
        except Exception as e:  # noqa: BLE001 - any failure means unhealthy
            return JSONResponse({"status": "unavailable", "error": f"{type(e).__name__}: {e}"}, status_code=503)
        store_behind = self._worlds is not None and self._worlds.degraded  # the world store down or slow
        body: dict[str, Any] = {"status": "degraded" if line_lost(line) or store_behind else "ok"}  # 200 either way
        if self._auth.authenticate(request)[0]:
            body.update({
                "replicas": {name: len(s) for name, s in stats.items()},
                "sessions": {name: sum(r["sessions"] for r in stats[name]) for name in ("vae", "dit")},
                "connections": self._open_connections,  # sockets (and offline videos) open on this replica
                "releasing": detached_running(),  # connection teardowns (and closes) still running
                "probe_s": probe,
                "line": line,  # the application's waiting room (null: none)
            })
            if self._worlds is not None:  # this replica's write-behind writer (deployments/ingress/worlds/)
                body["worlds"] = self._worlds.health()
            if self._prefix is not None:  # this ingress replica's store (deployments/ingress/prefix/)
                store = self._prefix[0]
                body["prefix_cache"] = {"bytes": store.nbytes, "max_bytes": store.max_bytes, "entries": len(store),
                                        "evictions": store.evictions, "materialised": dict(self._prefix[2].materialised)}
        return JSONResponse(body)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(self, request: Request) -> JSONResponse:
        self._require_key(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(self, request: Request) -> HTMLResponse:
        self._require_key(request)
        key = request.query_params.get("api_key")
        spec = "openapi.json" + (f"?api_key={quote(key, safe='')}" if key else "")  # relative: any prefix
        return get_swagger_ui_html(openapi_url=spec, title="lingbot-world-serve API")

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        """What is served: model, precision, video geometry, limits and session capacity."""
        self._require_key(request)
        stats, line = await asyncio.gather(self._replica_stats(), self._line())
        dit = stats["dit"]
        m = self._args.model
        return {"object": "list", "data": [{
            "id": m.preset,
            "object": "model",
            "checkpoint": self._handshake.checkpoint,  # the folder's name; null: random weights
            "random_weights": self._handshake.random_weights,  # the embedded tiny model or a load test's
            "dtype": m.dtype,
            "vae_dtype": m.vae_dtype,
            "kv_cache": m.kv_cache,
            "fp8": m.fp8,
            "fp8_attention": m.fp8_attention,
            "attention": m.attention,
            "device": m.device,
            "local_attn_size": m.local_attn_size,
            "sink_size": m.sink_size,
            "default_size": m.default_size,
            "default_resolution": list(self._handshake.image_resolution),
            "size_buckets": [list(b) for b in self._handshake.size_buckets or ()],
            "chunk_latent_frames": self._handshake.chunk_latent_frames,
            "first_chunk_video_frames": self._handshake.first_chunk_video_frames,
            "chunk_video_frames": self._handshake.chunk_video_frames,
            "fps": self._handshake.fps,
            "limits": asdict(self._limits),
            "sessions": {
                "replicas": len(dit),
                "capacity": sum(s["capacity"] for s in dit),
                "held": sum(s["sessions"] for s in dit),
                "max_chunks": self._args.sessions.max_chunks,
                "idle_ttl_s": self._args.sessions.idle_ttl_s,
                "min_fps": self._args.sessions.min_fps,
                "line": line,  # {waiting, max_waiting}: sessions waiting for a place (null: no waiting room)
            },
            "replicas": stats,  # per deployment, each replica's stats (memory, warm-up, sessions)
        }]}

    def _require_key(self, request: Request) -> None:
        if not self._auth.authenticate(request)[0]:
            raise HTTPException(status_code=401, detail="missing or wrong API key",
                                headers={"WWW-Authenticate": "Bearer"})

    async def _replica_stats(self) -> dict[str, list[dict[str, Any]]]:
        names = ("text_encoder", "vae", "dit")
        handles = (self._backends.text, self._backends.vae, self._backends.dit)
        results = await asyncio.gather(*(h.broadcast("stats").results_async() for h in handles))
        return dict(zip(names, results))

    async def _line(self) -> Optional[dict[str, Any]]:
        """The waiting room's length (None without one); a room that does not answer in time
        says so (`/healthz` degraded): its waiting sessions take their places again once it is
        back (line/regain.py)."""
        if self._backends.room is None:
            return None
        ended, result = await settle(self._backends.room.stats.remote(), LINE_STATS_TIMEOUT_S)
        if not ended or isinstance(result, BaseException):
            return {"error": "the waiting room did not answer" if not ended else f"{type(result).__name__}: {result}"}
        return result

    @app.websocket("/{path:path}")  # the last route: a WebSocket to any other path (signposts.py)
    async def wrong_socket(self, ws: WebSocket) -> None:
        await answer_wrong_socket(ws)
