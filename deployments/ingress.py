"""WorldIngress: the FastAPI app of the graph (WebSocket, health, model card, web page, videos).

No `from __future__ import annotations`: FastAPI must see the real `WebSocket` annotation of
the route methods that `serve.ingress` rewrites, or it treats `ws` as a query parameter.
"""

import asyncio
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.auth import Auth, bearer_subprotocol
from deployments.config import AppArgs
from deployments.connection import POLICY_VIOLATION, Backends, Connection
from deployments.metrics import IngressMetrics
from deployments.quotas import Quotas
from deployments.videos import mount_videos
from deployments.web import mount_web
from protocol.camera import parse_size
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply
from protocol.sizes import SizeRule

CAMERA_ROUTE = "/v1/realtime/world/camera"
HEALTH_TIMEOUT_S = 10.0
REFERENCE_ASPECT = (9, 16)  # the handshake's image_resolution is for a 16:9 image

app = FastAPI(title="lingbot-world-serve")
mount_web(app)  # the browser client at / (client/web)
mount_videos(app)  # POST /v1/videos: a whole trajectory through the camera handler (deployments/videos.py)


@serve.deployment
@serve.ingress(app)
class WorldIngress:
    """Holds the handles of the graph; one `Connection` per WebSocket."""

    def __init__(self, text: DeploymentHandle, vae: DeploymentHandle, dit: DeploymentHandle, args: AppArgs) -> None:
        self._backends = Backends(text=text, vae=vae, dit=dit)
        self._args = args
        m = args.model
        self._limits = Limits(max_message_bytes=args.max_message_bytes, max_num_frames=args.sessions.max_frames,
                              max_output_area=m.max_output_area, max_aspect_ratio=m.max_aspect_ratio)
        sizes = SizeRule(tuple(m.bucket_sizes()), m.max_output_area)
        self._handshake = CameraServerConfig(
            model=m.preset,
            image_resolution=sizes.output(parse_size(m.default_size), *REFERENCE_ASPECT),
            max_message_bytes=args.max_message_bytes,
            size_buckets=tuple(m.bucket_sizes()) or None,
        )
        self._auth = Auth(args.auth)
        self._quotas = Quotas(args.auth)
        self._metrics = IngressMetrics()
        self._open_connections = 0

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
            await ws.send_bytes(encode(ErrorReply(code=ErrorCode.UNAUTHORIZED, message=(
                "missing or wrong API key: send `Authorization: Bearer <key>`, the WebSocket subprotocol "
                "`lwf.bearer.<key>` or the `api_key` query parameter"))))
            await ws.close(code=POLICY_VIOLATION, reason="unauthorized")
            return
        self._open_connections += 1
        self._metrics.connections.set(self._open_connections)
        try:
            await Connection(ws, self._backends, self._args, self._limits, self._handshake, self._metrics,
                             self._quotas.for_key(key_id)).run()
        finally:
            self._open_connections -= 1
            self._metrics.connections.set(self._open_connections)

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
        stats = await self._replica_stats()
        dit = stats["dit"]
        m = self._args.model
        return {"object": "list", "data": [{
            "id": m.preset,
            "object": "model",
            "checkpoint": m.checkpoint is not None,
            "random_weights": m.random_weights,  # load tests: NOT a real model
            "dtype": m.dtype,
            "vae_dtype": m.vae_dtype,
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
            },
            "replicas": stats,  # per deployment, each replica's stats (memory, warm-up, sessions)
        }]}

    async def _replica_stats(self) -> dict[str, list[dict[str, Any]]]:
        names = ("text_encoder", "vae", "dit")
        handles = (self._backends.text, self._backends.vae, self._backends.dit)
        results = await asyncio.gather(*(h.broadcast("stats").results_async() for h in handles))
        return dict(zip(names, results))
