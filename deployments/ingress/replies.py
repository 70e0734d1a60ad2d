"""The replies of a `Connection` (connection.py): a chunk's frame reply once its decode is
done, errors and notices; they leave through the outbox (outbox.py). A chunk that fails
tells `lost` (releases.py: the stream is failed and freed).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Optional

from pydantic import BaseModel

from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.log import KeyValueLog
from deployments.metrics import IngressMetrics
from deployments.ingress.stream import Stream
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, ResetOk


class Replies:
    """Builds the replies of one connection."""

    def __init__(self, args: AppArgs, handshake: CameraServerConfig, metrics: IngressMetrics, log: KeyValueLog,
                 lost: Callable[[Stream], None], token: Callable[[Stream], Optional[str]],
                 kept: Optional[Callable[[Stream, int, Optional[bytes]], None]] = None) -> None:
        """`lost`: a stream's chunk failed (it is released); `token`: a stream's resume token,
        which its chunk-0 reply carries (resume.py); `kept`: a chunk's reply is built, with its
        video (the session's world in the store, worlds/sessions.py)."""
        self._max_chunks = args.sessions.max_chunks
        self._debug_fields = args.debug_fields
        self._fps = handshake.fps
        self._metrics = metrics
        self._log = log
        self._lost = lost
        self._token = token
        self._kept = kept

    def session_limit(self, stream: Stream, chunks_left: int, declared: Optional[int] = None) -> ErrorReply:
        """The chunk cap reached (`max_chunks`), or with `declared` the chunks its `num_frames`
        declared: all sent (chunks_left 0)."""
        n = self._max_chunks
        if declared is not None:
            message = (f"this session declared num_frames for {declared} chunks and all were sent; "
                       "reset to start a new session")
        elif chunks_left:
            message = (f"this session has produced {n - 1} of its {n} chunks: the next one is its "
                       "last (the model's RoPE table holds 1024 latent frames); reset to start a new session after it")
        else:
            message = (f"this session produced its {n} chunks, the most one session can (the model's RoPE table "
                       "holds 1024 latent frames); reset to start a new session")
        self._metrics.count_error(ErrorCode.SESSION_LIMIT.value)
        return ErrorReply(code=ErrorCode.SESSION_LIMIT, message=message, session_id=stream.spec.session_id,
                          chunks_left=chunks_left)

    async def notice_after(self, task: asyncio.Task, stream: Stream) -> ErrorReply:
        await asyncio.gather(task, return_exceptions=True)
        return self.session_limit(stream, 1)

    async def finish_chunk(self, stream: Stream, chunk_id: int, step: asyncio.Future, timings: dict[str, float],
                            client_chunk_id: Optional[int], reset: bool, t0: float) -> BaseModel:
        sid = stream.spec.session_id
        try:
            out, decoded = await step
            dec = await decoded
        except ReplicaError as e:
            self._lost(stream)
            return self.error(e.code, e.message, sid, getattr(e, "retry_after_s", None))
        except Exception as e:  # noqa: BLE001 - a replica died or failed: its state is gone
            self._log.exception("chunk failed", fields={"session": stream.key, "chunk": chunk_id})
            self._lost(stream)
            return self.error(ErrorCode.SESSION_LOST, f"the server lost this session ({type(e).__name__}); "
                                                       "send image and prompt to start again", sid)
        durations = {
            "text_encode": stream.journal.text_encode_s if chunk_id == 0 else 0.0,
            "vae_encode": timings["vae_encode"],
            "dit": out.dit_s,
            "vae_decode": dec["timings"]["vae_decode"],
            "mux": dec["timings"]["mux"],
        }
        durations["total"] = time.perf_counter() - t0
        durations["queue_wait"] = max(0.0, durations["total"] - sum(v for k, v in durations.items() if k != "total"))
        self._metrics.observe_chunk(durations)
        if self._kept is not None:  # written behind the stream (worlds/keeping.py): never waits
            self._kept(stream, chunk_id, dec["video"] if isinstance(dec["video"], bytes) else None)
        debug = None
        if self._debug_fields:
            debug = {"dit_replica": out.replica, "vae_replica": dec["replica"], "recoveries": stream.journal.recoveries}
        return FrameReply(
            session_id=sid, chunk_id=chunk_id, video=dec["video"], num_frames=dec["num_frames"],
            resolution=stream.spec.resolution, fps=self._fps, stage_durations=durations,
            client_chunk_id=client_chunk_id, reset=reset, mime_type=dec["mime_type"], debug=debug,
            resume_token=self._token(stream) if chunk_id == 0 else None,
        )

    async def reset_ok(self, session_id: str, release: Optional[asyncio.Task]) -> ResetOk:
        if release is not None:
            await release
        return ResetOk(session_id=session_id)

    def error(self, code: ErrorCode, message: str, session_id: Optional[str],
               retry_after_s: Optional[float] = None) -> ErrorReply:
        self._metrics.count_error(code.value)
        return ErrorReply(code=code, message=message, session_id=session_id,
                          retry_after_s=retry_after_s if code is ErrorCode.BUSY else None)
