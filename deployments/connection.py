"""Connection: one WebSocket of `/v1/realtime/world/camera` (PROTOCOL.md).

One receive loop decodes frames and dispatches them *synchronously*: dispatch never awaits
model work, so the loop keeps reading while chunks are in flight. Each infer becomes three
calls, queued at once on the connection's two lanes (one per stateful deployment, serial):

    VAE lane:  open, condition(0), condition(1), decode(0), condition(2), decode(1), ...
    DiT lane:  text + open, step(0), step(1), step(2), ...

`step(k)` waits for `condition(k)`; when it returns it queues `decode(k)` on the VAE lane, so
the DiT can run chunk k+1 while the VAE decodes chunk k. Replies leave through one ordered
outbox: in request order, whatever finishes first. Every call carries the session's key as
Serve session id (`handle.options(session_id=key)`), which the affinity router pins.

Each session keeps a journal (journal.py). A call that finds its replica dead or the session
gone rebuilds the session from it on a healthy replica (recovery.py), inside the same lane
job, and is made again: the client sees a slower chunk, not an error.

Abuse limits (`ClientPolicy`, AppArgs.connection) close the socket with 1008 (policy) and a
reason; per-key quotas (quotas.py) answer `busy`.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, TypeVar

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from ray.serve.handle import DeploymentHandle
from starlette.websockets import WebSocketState

from deployments.client_policy import ClientPolicy
from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.journal import SessionJournal
from deployments.lanes import Lane
from deployments.log import get_log
from deployments.metrics import IngressMetrics
from deployments.quotas import KeyQuota
from deployments.recovery import Recovery, needs_recovery
from deployments.stream import Stream, StreamSpec, StreamState, image_digest
from protocol.camera import CHUNK_LATENT_FRAMES, DEFAULT_INTRINSICS_RESOLUTION, frame_plan, parse_size
from protocol.codec import decode, encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.image import decode_image
from protocol.limits import Limits
from protocol.messages import (CameraServerConfig, ErrorReply, FrameReply, InferRequest, ResetOk,
                               ResetRequest, require_session_start)
from protocol.sizes import SizeRule

DEFAULT_SEED = 42  # the reference's base_seed
PIPELINE_RETRY_S = 0.5  # retry hint when a client has max_pending_chunks infers in flight
POLICY_VIOLATION = 1008
INTERNAL_ERROR = 1011
MIB = 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class Backends:
    """Handles of the deployments a connection calls."""

    text: DeploymentHandle
    vae: DeploymentHandle
    dit: DeploymentHandle


class Connection:
    """Serves one accepted WebSocket until the client leaves; releases its sessions after."""

    def __init__(self, ws: WebSocket, backends: Backends, args: AppArgs, limits: Limits,
                 handshake: CameraServerConfig, metrics: IngressMetrics, quota: Optional[KeyQuota] = None) -> None:
        """`quota`: the per-API-key quota this connection counts against (None: unlimited)."""
        self._ws = ws
        self._b = backends
        self._args = args
        self._limits = limits
        self._handshake = handshake
        self._metrics = metrics
        self._quota = quota
        self._log = get_log("connection", conn=uuid.uuid4().hex[:8])
        self._recovery = Recovery(backends.dit, backends.vae, args.sessions, self._log, metrics)
        self._policy = ClientPolicy(args.connection)
        self._sizes = SizeRule(tuple(args.model.bucket_sizes()), args.model.max_output_area)
        self._stream: Optional[Stream] = None
        self._held: dict[str, Stream] = {}  # every stream whose replicas may still hold state
        self._inflight: set[asyncio.Task] = set()  # chunks not yet answered
        self._background: set[asyncio.Task] = set()  # releases
        self._outbox: asyncio.Queue[asyncio.Future[BaseModel]] = asyncio.Queue()

    async def run(self) -> None:
        """Handshake, receive loop, cleanup (always)."""
        self._dit_lane = Lane("dit")
        self._vae_lane = Lane("vae")
        sender = asyncio.create_task(self._send_loop())
        self._reply_now(self._handshake)
        try:
            while True:
                msg = await self._next_message()
                if msg is None:
                    await self._close_socket(POLICY_VIOLATION, self._policy.silence_reason())
                    break
                if msg["type"] == "websocket.disconnect":
                    break
                violation = self._policy.on_frame(unsent_replies=self._outbox.qsize())
                if violation is not None:
                    await self._close_socket(POLICY_VIOLATION, violation)
                    break
                self._dispatch(msg.get("bytes"), time.perf_counter())
        except WebSocketDisconnect:
            pass
        except Exception:  # noqa: BLE001 - the connection edge: state unknown, close the socket
            self._log.exception("fatal error; closing the connection")
            await self._close_socket(INTERNAL_ERROR, "internal server error")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)  # a send may have failed: client gone
            await self._release_all()

    async def _next_message(self) -> Optional[dict[str, Any]]:
        """The next ASGI message; None when the client stayed silent too long (ClientPolicy)."""
        receive = asyncio.ensure_future(self._ws.receive())
        try:
            while (wait := self._policy.wait_s(busy=bool(self._inflight))) is not None:
                done, _ = await asyncio.wait({receive}, timeout=wait)
                if done:
                    return receive.result()
            return None
        finally:
            receive.cancel()  # no-op once done

    # ---- dispatch (synchronous: fixes the order of every call and reply) ----

    def _dispatch(self, data: Optional[bytes], t0: float) -> None:
        session_id = None
        try:
            if data is None:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "send binary frames holding one msgpack map, not text")
            req = decode(data, self._limits)
            session_id = req.session_id
            if isinstance(req, ResetRequest):
                self._on_reset(req)
            else:
                self._on_infer(req, t0)
        except ProtocolError as e:
            self._reply_now(self._error(e.code, e.message, session_id))
        except ReplicaError as e:  # a quota of the API key (busy)
            self._reply_now(self._error(e.code, e.message, session_id, getattr(e, "retry_after_s", None)))

    def _on_reset(self, req: ResetRequest) -> None:
        cur = self._stream
        release = None
        if cur is not None and cur.spec.session_id == req.session_id:
            self._stream = None
            release = self._close(cur)
        self._outbox.put_nowait(asyncio.ensure_future(self._reset_ok(req.session_id, release)))

    def _on_infer(self, req: InferRequest, t0: float) -> None:
        if len(self._inflight) >= self._args.sessions.max_pending_chunks:
            self._reply_now(self._error(
                ErrorCode.BUSY, f"{len(self._inflight)} infers of this connection are in flight (the most "
                "it may have); wait for a reply, then send this chunk again", req.session_id, PIPELINE_RETRY_S))
            return
        if self._quota is not None:
            self._quota.take_chunk()
        stream, reset = self._stream_for(req)
        total = stream.spec.total_latent_frames
        if total is not None and stream.next_chunk >= total // CHUNK_LATENT_FRAMES:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"the session declared num_frames for "
                                                     f"{total // CHUNK_LATENT_FRAMES} chunks and all were sent; "
                                                     "reset to start a new session")
        chunk_id = stream.take_chunk_id()
        timings: dict[str, float] = {}
        y = self._vae_lane.submit(partial(self._condition, stream, timings))
        step = self._dit_lane.submit(partial(self._step, stream, y, req.cameras.poses, req.cameras.intrinsics))
        task = asyncio.create_task(self._finish_chunk(stream, chunk_id, step, timings, req.client_chunk_id, reset, t0))
        stream.chunk_tasks.append(task)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        self._outbox.put_nowait(task)
        self._log.debug("chunk queued", fields={"session": stream.key, "chunk": chunk_id})

    def _stream_for(self, req: InferRequest) -> tuple[Stream, bool]:
        """The stream this infer continues, or a new one; True when a change reset the session."""
        cur = self._stream
        if cur is not None and cur.spec.session_id == req.session_id:
            if cur.state is StreamState.OPEN:
                changed = (req.prompt is not None and req.prompt != cur.spec.prompt) or (
                    req.image is not None and image_digest(req.image) != cur.spec.image_digest)
                if not changed:
                    return cur, False
                return self._replace(req), True
            if req.image is None or req.prompt is None:
                raise ProtocolError(ErrorCode.SESSION_LOST, "the server no longer holds this session; "
                                                            "send image and prompt to start it again")
        return self._replace(req), False

    def _replace(self, req: InferRequest) -> Stream:
        """Open a new stream for `req` (validated first), then release the current one."""
        require_session_start(req)
        image = decode_image(req.image, self._limits)  # RGB uint8 [H0, W0, 3]
        spec = self._stream_spec(req, image.shape[:2])
        sessions = self._args.sessions
        stream = Stream(spec, SessionJournal(image, int(sessions.journal_max_mib * MIB) if sessions.recovery else None))
        cur = self._stream
        open_now = cur is not None and cur.state is StreamState.OPEN
        if self._quota is not None:
            self._quota.start_session(stream.key, replacing=cur.key if open_now else None)
        if cur is not None and cur.state is not StreamState.CLOSED:
            self._close(cur)
        self._stream = stream
        self._held[stream.key] = stream
        h, w = spec.resolution
        key = stream.vae_key
        stream.vae_open = self._vae_lane.submit(
            lambda: self._b.vae.options(session_id=key).open.remote(key, image, h, w))
        stream.dit_open = self._dit_lane.submit(partial(self._open_dit, stream))
        self._log.info("session started", fields={"session": req.session_id, "key": stream.key,
                                                  "resolution": f"{h}x{w}"})
        return stream

    def _stream_spec(self, req: InferRequest, image_hw: tuple[int, int]) -> StreamSpec:
        """Session options of a first infer -> StreamSpec; ProtocolError for unusable values."""
        max_area = req.max_area or parse_size(self._args.model.default_size)
        resolution = self._sizes.output(max_area, *image_hw)  # buckets, bounds (ProtocolError)
        try:
            total = None if req.num_frames is None else frame_plan(req.num_frames, req.num_frames)[1]
        except ValueError as e:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
        return StreamSpec(
            session_id=req.session_id, prompt=req.prompt, image_digest=image_digest(req.image),
            resolution=resolution, seed=DEFAULT_SEED if req.seed is None else req.seed,
            total_latent_frames=total, translation_scale=req.translation_scale,
            intrinsics_resolution=tuple(req.intrinsics_resolution or DEFAULT_INTRINSICS_RESOLUTION),
        )

    # ---- lane jobs (each one call to one deployment) ----

    async def _open_dit(self, stream: Stream) -> None:
        """DiT lane: encode the prompt, then open the session on a DiT replica (may be busy)."""
        t = time.perf_counter()
        context = await self._b.text.encode.remote(stream.spec.prompt)
        stream.text_encode_s = time.perf_counter() - t
        stream.journal.set_context(context)
        h, w = stream.spec.resolution
        key = stream.dit_key
        replica = await self._b.dit.options(session_id=key).open.remote(
            key, context, h, w, stream.spec.seed, stream.spec.total_latent_frames,
            stream.spec.translation_scale, stream.spec.intrinsics_resolution)
        self._log.info("session opened", fields={"session": key, "dit_replica": replica})

    async def _condition(self, stream: Stream, timings: dict[str, float]) -> np.ndarray:
        """VAE lane: the chunk's conditioning y."""
        t = time.perf_counter()
        y = await self._on_vae(stream, lambda key: self._b.vae.options(session_id=key).condition.remote(key))
        stream.journal.conditioned += 1
        timings["vae_encode"] = time.perf_counter() - t
        return y

    async def _step(self, stream: Stream, y_fut: asyncio.Future, poses: np.ndarray,
                    intrinsics: np.ndarray) -> tuple[dict[str, Any], asyncio.Future]:
        """DiT lane: one chunk step (rebuilding the session first when it was lost); queues the
        chunk's decode on the VAE lane when done."""
        y = await y_fut

        def step(key: str) -> Awaitable[dict[str, Any]]:
            return self._b.dit.options(session_id=key).step.remote(key, y, poses, intrinsics)

        try:
            await stream.dit_open  # re-raises the open's failure
            out = await step(stream.dit_key)
        except Exception as e:
            if not needs_recovery(e) or stream.state is not StreamState.OPEN:  # reset or failed: no rebuild
                raise
            await self._recovery.dit(stream, e)
            stream.dit_open = _done()
            out = await step(stream.dit_key)
        stream.journal.add_chunk(poses, intrinsics, y, out["latents"], out["noise"])
        decoded = self._vae_lane.submit(partial(self._decode, stream, out["latents"]))
        return out, decoded

    async def _decode(self, stream: Stream, latents: np.ndarray) -> dict[str, Any]:
        """VAE lane: decode and mux one chunk."""
        out = await self._on_vae(stream, lambda key: self._b.vae.options(session_id=key).decode.remote(key, latents))
        stream.journal.decoded += 1
        return out

    async def _on_vae(self, stream: Stream, call: Callable[[str], Awaitable[T]]) -> T:
        """`call(vae_key)` inside a VAE lane job; the session is rebuilt once when it was lost."""
        try:
            await stream.vae_open  # re-raises the open's failure
            return await call(stream.vae_key)
        except Exception as e:
            if not needs_recovery(e) or stream.state is not StreamState.OPEN:  # reset or failed: no rebuild
                raise
            await self._recovery.vae(stream, e)
            stream.vae_open = _done()
            return await call(stream.vae_key)

    # ---- replies ----

    async def _finish_chunk(self, stream: Stream, chunk_id: int, step: asyncio.Future, timings: dict[str, float],
                            client_chunk_id: Optional[int], reset: bool, t0: float) -> BaseModel:
        sid = stream.spec.session_id
        try:
            out, decoded = await step
            dec = await decoded
        except ReplicaError as e:
            self._fail(stream)
            return self._error(e.code, e.message, sid, getattr(e, "retry_after_s", None))
        except Exception as e:  # noqa: BLE001 - a replica died or failed: its state is gone
            self._log.exception("chunk failed", fields={"session": stream.key, "chunk": chunk_id})
            self._fail(stream)
            return self._error(ErrorCode.SESSION_LOST, f"the server lost this session ({type(e).__name__}); "
                                                       "send image and prompt to start again", sid)
        durations = {
            "text_encode": stream.text_encode_s if chunk_id == 0 else 0.0,
            "vae_encode": timings["vae_encode"],
            "dit": sum(out["timings"].values()),
            "vae_decode": dec["timings"]["vae_decode"],
            "mux": dec["timings"]["mux"],
        }
        durations["total"] = time.perf_counter() - t0
        durations["queue_wait"] = max(0.0, durations["total"] - sum(v for k, v in durations.items() if k != "total"))
        self._metrics.observe_chunk(durations)
        debug = None
        if self._args.debug_fields:
            debug = {"dit_replica": out["replica"], "vae_replica": dec["replica"], "recoveries": stream.recoveries}
        return FrameReply(
            session_id=sid, chunk_id=chunk_id, video=dec["video"], num_frames=dec["num_frames"],
            resolution=stream.spec.resolution, fps=self._handshake.fps, stage_durations=durations,
            client_chunk_id=client_chunk_id, reset=reset, mime_type=dec["mime_type"], debug=debug,
        )

    async def _reset_ok(self, session_id: str, release: Optional[asyncio.Task]) -> ResetOk:
        if release is not None:
            await release
        return ResetOk(session_id=session_id)

    def _error(self, code: ErrorCode, message: str, session_id: Optional[str],
               retry_after_s: Optional[float] = None) -> ErrorReply:
        self._metrics.count_error(code.value)
        return ErrorReply(code=code, message=message, session_id=session_id,
                          retry_after_s=retry_after_s if code is ErrorCode.BUSY else None)

    def _reply_now(self, reply: BaseModel) -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        self._outbox.put_nowait(fut)

    async def _send_loop(self) -> None:
        while True:
            reply = await (await self._outbox.get())
            await self._ws.send_bytes(encode(reply))
            self._policy.on_reply()

    # ---- session release ----

    def _fail(self, stream: Stream) -> None:
        if stream.fail():
            self._ended(stream)
            stream.release = self._release_later(stream)

    def _close(self, stream: Stream) -> Optional[asyncio.Task]:
        """Close a stream; its release task (started now if it was open)."""
        if stream.close():
            self._ended(stream)
            stream.release = self._release_later(stream)
        return stream.release

    def _ended(self, stream: Stream) -> None:
        if self._quota is not None:
            self._quota.end_session(stream.key)

    def _release_later(self, stream: Stream) -> asyncio.Task:
        """Free the stream on both replicas, each close queued on its lane behind the stream's
        own calls and, where possible, before the open of any session started after it (which
        then never finds the replica full of its own predecessor). Every DiT call of the stream
        is queued already (steps are queued at infer time): its close goes now. VAE decodes are
        queued as steps finish: its close goes now when no chunk is in flight, else after them."""
        dit_close = self._dit_lane.submit(lambda: self._b.dit.options(session_id=stream.dit_key).close.remote(
            stream.dit_key))  # the key is read when the close runs: a rebuild may change it until then
        pending = [t for t in stream.chunk_tasks if not t.done()]
        vae_close = None if pending else self._vae_lane.submit(self._vae_close_job(stream))
        task = asyncio.create_task(self._release(stream, pending, dit_close, vae_close))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _vae_close_job(self, stream: Stream) -> Callable[[], Awaitable[bool]]:
        return lambda: self._b.vae.options(session_id=stream.vae_key).close.remote(stream.vae_key)

    async def _release(self, stream: Stream, pending: list[asyncio.Task], dit_close: asyncio.Future,
                       vae_close: Optional[asyncio.Future]) -> None:
        """Wait for the closes (the VAE's once the chunks in flight are answered)."""
        await asyncio.gather(*pending, return_exceptions=True)
        if vae_close is None:
            vae_close = self._vae_lane.submit(self._vae_close_job(stream))
        results = await asyncio.gather(dit_close, vae_close, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                self._log.warning("close failed; the replica's TTL frees it",
                                  fields={"session": stream.key, "error": repr(r)})
        self._held.pop(stream.key, None)

    async def _release_all(self) -> None:
        """Connection end: stop all work, then close every session still held (one call at a time)."""
        for t in [*self._inflight, *self._background]:
            t.cancel()
        await self._dit_lane.stop()
        await self._vae_lane.stop()
        for stream in list(self._held.values()):
            self._ended(stream)
            for handle, key in ((self._b.dit, stream.dit_key), (self._b.vae, stream.vae_key)):
                try:
                    await handle.options(session_id=key).close.remote(key)
                except Exception as e:  # noqa: BLE001 - best effort; the replica TTL is the backstop
                    self._log.warning("close failed", fields={"session": key, "error": repr(e)})
        self._held.clear()

    async def _close_socket(self, code: int, reason: str) -> None:
        if self._ws.application_state is WebSocketState.CONNECTED:
            await self._ws.close(code=code, reason=reason)



def _done() -> asyncio.Future:
    """A resolved future: the open that a rebuild superseded."""
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut
