"""The replies of a `Connection` (connection.py): a chunk's frame reply once its decode is
done, errors, notices, and the one ordered outbox they leave through.

Every reply, whatever finishes first, goes out in request order: the outbox holds a future per
reply, with the stream whose chunk it answers (resume.py counts what was sent). `Replies` is a
base class of `Connection`, which sets the attributes it declares.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from pydantic import BaseModel
from starlette.websockets import WebSocketState

from deployments.ingress.guards.client_policy import ClientPolicy
from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.log import KeyValueLog
from deployments.metrics import IngressMetrics
from deployments.ingress.stream import Stream
from deployments.ingress.transport import Transport
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, ResetOk


class Replies:
    """Builds and sends the replies of one connection (a mixin of `Connection`)."""

    _ws: Transport
    _args: AppArgs
    _handshake: CameraServerConfig
    _metrics: IngressMetrics
    _log: KeyValueLog
    _policy: ClientPolicy
    _outbox: asyncio.Queue[tuple[asyncio.Future[BaseModel], Optional[Stream]]]
    _fail: Any  # Releases: a stream the server lost
    _sent: Any  # Resume: a frame reply of a stream was sent

    def _session_limit(self, stream: Stream, chunks_left: int) -> ErrorReply:
        n = self._args.sessions.max_chunks
        if chunks_left:
            message = (f"this session has produced {n - 1} of its {n} chunks: the next one is its "
                       "last (the model's RoPE table holds 1024 latent frames); reset to start a new session after it")
        else:
            message = (f"this session produced its {n} chunks, the most one session can (the model's RoPE table "
                       "holds 1024 latent frames); reset to start a new session")
        self._metrics.count_error(ErrorCode.SESSION_LIMIT.value)
        return ErrorReply(code=ErrorCode.SESSION_LIMIT, message=message, session_id=stream.spec.session_id,
                          chunks_left=chunks_left)

    async def _notice_after(self, task: asyncio.Task, stream: Stream) -> ErrorReply:
        await asyncio.gather(task, return_exceptions=True)
        return self._session_limit(stream, 1)

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
            "dit": out.dit_s,
            "vae_decode": dec["timings"]["vae_decode"],
            "mux": dec["timings"]["mux"],
        }
        durations["total"] = time.perf_counter() - t0
        durations["queue_wait"] = max(0.0, durations["total"] - sum(v for k, v in durations.items() if k != "total"))
        self._metrics.observe_chunk(durations)
        debug = None
        if self._args.debug_fields:
            debug = {"dit_replica": out.replica, "vae_replica": dec["replica"], "recoveries": stream.recoveries}
        return FrameReply(
            session_id=sid, chunk_id=chunk_id, video=dec["video"], num_frames=dec["num_frames"],
            resolution=stream.spec.resolution, fps=self._handshake.fps, stage_durations=durations,
            client_chunk_id=client_chunk_id, reset=reset, mime_type=dec["mime_type"], debug=debug,
            resume_token=stream.resume_token if chunk_id == 0 else None,
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

    def _reply_now(self, reply: BaseModel, stream: Optional[Stream] = None) -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        self._outbox.put_nowait((fut, stream))

    async def _send_loop(self) -> None:
        while True:
            fut, stream = await self._outbox.get()
            reply = await asyncio.shield(fut)  # the sender's cancel (socket end) must not cancel a chunk (resume)
            await self._ws.send_bytes(encode(reply))
            if stream is not None and isinstance(reply, FrameReply):
                self._sent(stream, reply)
            self._outbox.task_done()
            self._policy.on_reply()

    async def _flush_replies(self, timeout_s: float) -> None:
        """Wait (bounded) until the replies queued so far are sent."""
        await asyncio.wait({asyncio.ensure_future(self._outbox.join())}, timeout=timeout_s)

    async def _close_socket(self, code: int, reason: str) -> None:
        if self._ws.application_state is WebSocketState.CONNECTED:
            await self._ws.close(code=code, reason=reason)
