"""WorldIngress: the FastAPI app of the graph (WebSocket, health, model card, web page, videos).

The camera route and `POST /v1/videos` both serve a `Connection` (`_serve`): over the
WebSocket, or over an in-process transport driven by the videos' session runner.

No `from __future__ import annotations`: FastAPI must see the real `WebSocket` annotation of
the route methods that `serve.ingress` rewrites, or it treats `ws` as a query parameter.
"""

import asyncio
from dataclasses import asdict
from typing import Any, Optional

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from camera import output_size, parse_size
from deployments.auth import UNAUTHORIZED_MESSAGE, Auth, bearer_subprotocol
from deployments.config import AppArgs
from deployments.connection import POLICY_VIOLATION, Backends, Connection
from deployments.metrics import IngressMetrics
from deployments.quotas import Quotas
from deployments.transport import Transport
from deployments.videos import ROUTE as VIDEOS_ROUTE
from deployments.videos import VideoEndpoint
from deployments.videos.runner import SessionRunner
from deployments.web import mount_web
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply

CAMERA_ROUTE = "/v1/realtime/world/camera"
HEALTH_TIMEOUT_S = 10.0
REFERENCE_ASPECT = (9, 16)  # the handshake's image_resolution is for a 16:9 image
VIDEO_PIPELINE = 2  # a video's chunk k+1 DiT step overlaps chunk k's decode

app = FastAPI(title="lingbot-world-serve")
mount_web(app)  # the browser client at / (the `web` package's files)


@serve.deployment
@serve.ingress(app)
class WorldIngress:
    """Holds the handles of the graph; one `Connection` per WebSocket."""

    def __init__(self, text: DeploymentHandle, vae: DeploymentHandle, dit: DeploymentHandle, args: AppArgs) -> None:
        self._backends = Backends(text=text, vae=vae, dit=dit)
        self._args = args
        self._limits = Limits(max_message_bytes=args.max_message_bytes, max_num_frames=args.sessions.max_frames)
        self._handshake = CameraServerConfig(
            model=args.model.preset,
            image_resolution=output_size(parse_size(args.model.default_size), *REFERENCE_ASPECT),
            max_message_bytes=args.max_message_bytes,
        )
        self._auth = Auth(args.auth)
        self._quotas = Quotas(args.auth)
        self._metrics = IngressMetrics()
        self._open_connections = 0
        runner = SessionRunner(self._serve, min(VIDEO_PIPELINE, args.sessions.max_pending_chunks),
                               args.videos.busy_timeout_s)
        self._videos = VideoEndpoint(args.videos, self._auth, self._limits, runner, args.sessions.retry_after_s)

    @app.websocket(CAMERA_ROUTE)
    async def camera(self, ws: WebSocket) -> None:
        if not self._auth.origin_allowed(ws):
            await ws.close(code=POLICY_VIOLATION, reason="origin not allowed")  # before accept: HTTP 403
            return
        subprotocol = bearer_subprotocol(ws)  # a browser that offered one fails unless it is echoed
        await (ws.accept(subprotocol=subprotocol) if subprotocol else ws.accept())
        accepted, key_id = self._auth.authenticate(ws)
        if not accepted:
            self._metrics.count_error(ErrorCode.UNAUTHORIZED.value)
            await ws.send_bytes(encode(ErrorReply(code=ErrorCode.UNAUTHORIZED, message=UNAUTHORIZED_MESSAGE)))
            await ws.close(code=POLICY_VIOLATION, reason="unauthorized")
            return
        await self._serve(ws, key_id)

    async def _serve(self, transport: Transport, key_id: Optional[str]) -> None:
        """One `Connection` on an accepted transport, counting against `key_id`'s quotas."""
        self._open_connections += 1
        self._metrics.connections.set(self._open_connections)
        try:
            await Connection(transport, self._backends, self._args, self._limits, self._handshake, self._metrics,
                             self._quotas.for_key(key_id)).run()
        finally:
            self._open_connections -= 1
            self._metrics.connections.set(self._open_connections)

    @app.post(VIDEOS_ROUTE, response_class=Response)
    async def create_video(self, request: Request) -> Response:
        """A whole trajectory -> one MP4, or a job with `?async=true` (deployments/videos)."""
        return await self._videos.create(request)

    @app.get(VIDEOS_ROUTE + "/{job_id}")
    async def video_status(self, job_id: str, request: Request) -> JSONResponse:
        return self._videos.status(job_id, request)

    @app.get(VIDEOS_ROUTE + "/{job_id}/content", response_class=Response)
    async def video_content(self, job_id: str) -> Response:
        return self._videos.content(job_id)

    @app.get("/healthz")
    async def healthz(self) -> JSONResponse:
        """200 when every replica of every deployment answers, else 503; replica, session and
        (this replica's) WebSocket counts."""
        try:
            stats = await asyncio.wait_for(self._replica_stats(), HEALTH_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - any failure means unhealthy
            return JSONResponse({"status": "unavailable", "error": f"{type(e).__name__}: {e}"}, status_code=503)
        return JSONResponse({
            "status": "ok",
            "replicas": {name: len(s) for name, s in stats.items()},
            "sessions": {name: sum(r["sessions"] for r in stats[name]) for name in ("vae", "dit")},
            "connections": self._open_connections,  # WebSockets open on the ingress replica that answered
        })

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        """What is served: model, precision, video geometry, limits and session capacity."""
        dit = (await self._replica_stats())["dit"]
        m = self._args.model
        return {"object": "list", "data": [{
            "id": m.preset,
            "object": "model",
            "checkpoint": m.checkpoint is not None,
            "dtype": m.dtype,
            "vae_dtype": m.vae_dtype,
            "device": m.device,
            "local_attn_size": m.local_attn_size,
            "sink_size": m.sink_size,
            "default_size": m.default_size,
            "default_resolution": list(self._handshake.image_resolution),
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
            },
        }]}

    async def _replica_stats(self) -> dict[str, list[dict[str, Any]]]:
        names = ("text_encoder", "vae", "dit")
        handles = (self._backends.text, self._backends.vae, self._backends.dit)
        results = await asyncio.gather(*(h.broadcast("stats").results_async() for h in handles))
        return dict(zip(names, results))
