"""WorldRoutes: the handlers behind the ingress's `/v1/worlds` routes (the caller's worlds).

    GET    /v1/worlds                  -> 200 {"object": "list", "data": [world, ...]}, newest update first
    DELETE /v1/worlds/{id}             -> 200 {"deleted": id}
    GET    /v1/worlds/{id}/video       -> 200 video/mp4: the init segment and every stored chunk's fragment
    GET    /v1/worlds/{id}/export      -> 200 application/octet-stream: the world as one `.lwf` file
    POST   /v1/worlds/import           application/octet-stream `.lwf` body -> 201 world (a new id, the caller's)

Every route passes the WebSocket's checks first (origin, then API key: auth.py), as
`/v1/videos` does. The caller's worlds are its principal's (the API key, else the client
address: the principal a connection writes its sessions' worlds under), so another's world id
answers 404 `world_not_found` exactly like an unknown one. An import must be declared
`application/octet-stream` (415 otherwise: what a page of another site can post without a
CORS preflight never starts one), is read up to `worlds.max_import_mib` (413 past it, the rest
unread; one import at a time per replica), and is checked whole before anything is written
(lwf.py: `bad_world_file`, nothing in the store). The store's calls run in a worker thread.
Errors are `{"type": "error", "code", "message"}` with the store's codes: 400 `bad_world_id` /
`bad_world_file`, 404 `world_not_found`, 413 `world_quota` / `too_large`, 503
`store_unavailable`; 404 `worlds_off` when the server keeps no worlds.
"""
from __future__ import annotations

import asyncio
import io
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from deployments.ingress.guards.auth import UNAUTHORIZED_MESSAGE, Auth
from deployments.ingress.guards.connection_caps import client_address
from deployments.ingress.worlds.keeping import WorldKeeping
from deployments.worlds.errors import (BadWorldFile, BadWorldKey, QuotaExceeded, StoreUnavailable, WorldError,
                                       WorldNotFound)
from deployments.worlds.lwf import export_world, import_world
from deployments.worlds.manifest import Manifest

MIB = 1024 * 1024
STATUS = {BadWorldKey: 400, BadWorldFile: 400, WorldNotFound: 404, QuotaExceeded: 413, StoreUnavailable: 503}
LWF_TYPE = "application/octet-stream"


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "code": code, "message": message}, status)


def view(m: Manifest) -> dict[str, Any]:
    """A world as listed (what a person picks it by; the model's fields and owner digest stay in the store)."""
    return {"id": m.world_id, "object": "world", "title": m.title, "chunks": m.chunks, "bytes": m.bytes,
            "created": m.created, "updated": m.updated, "model": m.model_id, "dtype": m.dtype,
            "attention": m.attention, "size": [m.height, m.width], "seed": m.seed, "prompt": m.prompt}


class WorldRoutes:
    """One per ingress replica (None `keeping`: the server keeps no worlds)."""

    def __init__(self, keeping: Optional[WorldKeeping], auth: Auth, trust_forwarded_for: bool = False) -> None:
        self._k = keeping
        self._auth = auth
        self._trust_forwarded_for = trust_forwarded_for
        self._importing = asyncio.Lock()  # one import body held at a time

    def _admit(self, request: Request) -> str | JSONResponse:
        """The caller's principal, or the refusal (origin, API key, worlds off)."""
        if not self._auth.origin_allowed(request):
            return _error(403, "forbidden", "origin not allowed")
        accepted, key_id = self._auth.authenticate(request)
        if not accepted:
            return _error(401, "unauthorized", UNAUTHORIZED_MESSAGE)
        if self._k is None:
            return _error(404, "worlds_off", "this server keeps no worlds (worlds.enabled is off)")
        return f"key:{key_id}" if key_id is not None else f"addr:{client_address(request, self._trust_forwarded_for)}"

    async def _call(self, request: Request, fn, *args) -> Any:
        principal = self._admit(request)
        if isinstance(principal, JSONResponse):
            return principal
        try:
            return await asyncio.to_thread(fn, principal, *args)
        except WorldError as e:
            return _error(STATUS.get(type(e), 400), e.code, e.message)

    async def list(self, request: Request) -> Response:
        out = await self._call(request, lambda p: [view(m) for m in self._k.worlds.list(p)])
        return out if isinstance(out, Response) else JSONResponse({"object": "list", "data": out})

    async def delete(self, world_id: str, request: Request) -> Response:
        out = await self._call(request, lambda p, w: self._k.worlds.delete(p, w), world_id)
        return out if isinstance(out, Response) else JSONResponse({"deleted": world_id})

    async def video(self, world_id: str, request: Request) -> Response:
        def mp4(principal: str, wid: str) -> bytes:
            """The stored chunks' fMP4 bytes in order, up to the first without its video."""
            out = bytearray()
            for chunk in self._k.worlds.load(principal, wid).chunks:
                if chunk.video is None:
                    break
                out += chunk.video
            return bytes(out)

        out = await self._call(request, mp4, world_id)
        return out if isinstance(out, Response) else Response(out, media_type="video/mp4")

    async def export(self, world_id: str, request: Request) -> Response:
        def lwf(principal: str, wid: str) -> bytes:
            buf = io.BytesIO()
            export_world(self._k.worlds, principal, wid, buf)
            return buf.getvalue()

        out = await self._call(request, lwf, world_id)
        if isinstance(out, Response):
            return out
        return Response(out, media_type=LWF_TYPE,
                        headers={"Content-Disposition": f'attachment; filename="{world_id}.lwf"'})

    async def import_(self, request: Request) -> Response:
        principal = self._admit(request)
        if isinstance(principal, JSONResponse):
            return principal
        kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind != LWF_TYPE:
            return _error(415, "unsupported_media_type", f"send the .lwf file as {LWF_TYPE}")
        limit = int(self._k.args.worlds.max_import_mib * MIB)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return _error(413, "too_large", f"an import is at most {limit} bytes (worlds.max_import_mib)")
        async with self._importing:
            body = bytearray()
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    return _error(413, "too_large", f"an import is at most {limit} bytes (worlds.max_import_mib)")
            out = await self._call(request, lambda p: import_world(self._k.worlds, p, io.BytesIO(body), limit))
        return out if isinstance(out, Response) else JSONResponse(view(out), 201)
