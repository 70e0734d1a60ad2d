"""PeerTransport: the camera socket as a `Connection` sees it, in our protocol or in clip mode.

Until the mode is known it passes everything through. The first binary frame decides (or the
`?mode=` query parameter did already): a request only the peers' clients send (peer.py)
switches the connection to clip mode for good; anything else leaves it in our protocol, and
the transport stays a plain pass-through.

In clip mode each peer frame becomes our frames (chunks.py), released to the Connection at
most `pipeline` at a time so that a long clip never trips `max_pending_chunks`; every frame
handed over gets exactly one answer (frame, error, reset_ok), matched in order to what it
stood for and translated (replies.py). Sessions opened here get raw frames from the VAE
(`raw_frames`), not fMP4. A peer frame the translation refuses reaches the Connection as one
undecodable byte, so that its abuse limits count it and its error keeps its place in order;
the error sent is the translation's.
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from starlette.websockets import WebSocket, WebSocketState

from deployments.ingress.peers.chunks import extension_clip, first_clip
from deployments.ingress.peers.peer import DEFAULT_SESSION, is_peer_request, read_call
from deployments.ingress.peers.replies import (RESET_REPLY, RESET_TEXT, ClipFrames, check_message_frames, error_message, frames_of,
                                      pack)
from deployments.ingress.resume import CLIP_RESUME
from deployments.ingress.transport import NORMAL_CLOSURE, oversize
from protocol.codec import decode_reply, encode, unpack, validated
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, Queued, ResetOk, ResetRequest

CLIP_MODE, CHUNK_MODE = "clip", "chunk"  # values of the `mode` query parameter
_UNDECODABLE = b"\xc1"  # never valid msgpack: the Connection refuses it with bad_message


@dataclass(frozen=True)
class _Expect:
    """What one frame handed to the Connection stood for: a clip's chunk, a reset, or a
    refused peer frame (`error`: the translation's own error)."""

    clip: Optional[ClipFrames] = None
    reset: bool = False
    error: Optional[ProtocolError] = None


class PeerTransport:
    """Wraps an accepted WebSocket for one Connection (see the module doc)."""

    def __init__(self, ws: WebSocket, limits: Limits, pipeline: int, mode: Optional[str] = None,
                 resumable: bool = False, one_reply: bool = False) -> None:
        """`resumable`: the server keeps sessions across connections (a clip without image for
        a session this socket does not hold then resumes the client's parked clip session).
        `one_reply`: every request gets exactly one message (openpi's `infer()` reads one): a
        clip's frames all in one, a reset as a map (`RESET_REPLY`), not text."""
        self._ws = ws
        self._resumable = resumable
        self._limits = limits
        self._pipeline = pipeline
        self._mode = mode if mode in (CLIP_MODE, CHUNK_MODE) else None
        self._one_reply = one_reply
        self._socket: Optional[asyncio.Future] = None  # the pending ws.receive(), kept across calls
        self._queue: deque[tuple[bytes, _Expect]] = deque()  # translated, not yet handed over
        self._expect: deque[_Expect] = deque()  # handed over, not yet answered
        self._wake = asyncio.Event()  # an answer came: the queue may move
        self._session: Optional[str] = None  # the session this connection's clips continue
        self._next_chunk = 0  # chunks queued in it

    @property
    def application_state(self) -> WebSocketState:
        return self._ws.application_state

    @property
    def raw_frames(self) -> bool:
        """Sessions opened on this transport decode to raw frames (read by the Connection)."""
        return self._mode == CLIP_MODE

    async def close(self, code: int = NORMAL_CLOSURE, reason: Optional[str] = None) -> None:
        await self._ws.close(code=code, reason=reason)

    def stop(self) -> None:
        """The Connection ended: stop reading the socket."""
        if self._socket is not None:
            self._socket.cancel()

    # ---- client -> Connection ----

    async def receive(self) -> dict[str, Any]:
        while True:
            if self._queue and len(self._expect) < self._pipeline:
                data, expect = self._queue.popleft()
                self._expect.append(expect)
                return {"type": "websocket.receive", "bytes": data}
            if self._socket is None:
                self._socket = asyncio.ensure_future(self._ws.receive())
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({self._socket, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
            if not self._socket.done():
                continue
            msg, self._socket = self._socket.result(), None
            if msg["type"] != "websocket.receive":
                return msg  # disconnect: clips not yet handed over are dropped with the socket
            data = msg.get("bytes")
            if self._mode is None:
                self._mode = self._sniff(data)
            if self._mode == CHUNK_MODE:
                return msg
            if (kept_back := oversize(msg, self._limits)) is not None:  # by the proxy guard
                self._queue.append((_UNDECODABLE, _Expect(error=kept_back)))
                continue
            self._translate(data)

    def _sniff(self, data: Optional[bytes]) -> str:
        try:
            return CLIP_MODE if data is not None and is_peer_request(unpack(data, self._limits)) else CHUNK_MODE
        except ProtocolError:
            return CHUNK_MODE  # our Connection answers it

    def _translate(self, data: Optional[bytes]) -> None:
        """One peer frame -> frames queued for the Connection."""
        try:
            if data is None:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "send binary frames holding one msgpack map, not text")
            obj = unpack(data, self._limits)
            if not isinstance(obj, dict):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "a message must be a msgpack map")
            if obj.get("endpoint", "infer") == "reset":
                self._reset(obj)
            elif obj.get("endpoint", "infer") == "infer":
                self._clip(obj)
            else:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "`endpoint` must be `infer` (or left out) or `reset`")
        except ProtocolError as e:
            self._queue.append((_UNDECODABLE, _Expect(error=e)))
        except (ValueError, TypeError, OverflowError, RecursionError) as e:  # a hostile shape no check foresaw
            self._queue.append((_UNDECODABLE, _Expect(error=ProtocolError(
                ErrorCode.BAD_MESSAGE, f"the request could not be read ({type(e).__name__}); send the fields the "
                                       "peers' clients send (docs/COMPATIBILITY.md)"))))

    def _reset(self, obj: dict) -> None:
        sid = obj.get("session_id") or self._session or DEFAULT_SESSION
        if not isinstance(sid, str):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "`session_id` must be a string (or left out)")
        self._queue.append((encode(validated(ResetRequest, {"session_id": sid})), _Expect(reset=True)))
        self._session, self._next_chunk = None, 0

    def _clip(self, obj: dict) -> None:
        call = read_call(obj)
        if call.session_id == self._session and self._next_chunk:
            chunks, session = extension_clip(call, self._next_chunk, self._limits), (self._session, self._next_chunk)
        elif call.image is None and self._resumable:  # an extension on a new socket: resume (resume.py)
            chunks, session = extension_clip(call, 0, self._limits, resume_token=CLIP_RESUME), (call.session_id, 0)
        else:
            chunks, session = first_clip(call, self._limits), (call.session_id, 0)
        per_message = chunks.frames if self._one_reply else min(call.frames_per_message, chunks.frames)
        check_message_frames(per_message, self._limits)  # before any state moves: a refusal changes nothing
        self._session, self._next_chunk = session[0], session[1] + len(chunks.infers)
        clip = ClipFrames(len(chunks.infers), chunks.frames, per_message)
        self._queue.extend((data, _Expect(clip=clip)) for data in chunks.infers)

    # ---- Connection -> client ----

    async def send_bytes(self, data: bytes) -> None:
        if self._mode != CLIP_MODE:
            await self._ws.send_bytes(data)
            return
        reply = decode_reply(data)
        if isinstance(reply, (CameraServerConfig, Queued)) or (isinstance(reply, ErrorReply) and reply.is_notice):
            if isinstance(reply, CameraServerConfig):
                await self._ws.send_bytes(data)
            return
        expect = self._expect.popleft()
        self._wake.set()
        if expect.error is not None:
            await self._ws.send_bytes(pack(error_message(ErrorReply(
                code=expect.error.code, message=expect.error.message, session_id=expect.error.session_id))))
        elif expect.reset and self._one_reply:
            await self._ws.send_bytes(pack(RESET_REPLY))
        elif expect.reset:
            await self._ws.send_text(RESET_TEXT)
        elif expect.clip is not None:
            await self._answer_clip(expect.clip, reply)
        elif isinstance(reply, ErrorReply):
            await self._ws.send_bytes(pack(error_message(reply)))

    async def _answer_clip(self, clip: ClipFrames, reply: Any) -> None:
        if clip.failed:
            clip.chunks_left -= 1
            return
        if isinstance(reply, FrameReply):
            for message in clip.add(frames_of(reply)):
                await self._ws.send_bytes(message)
            return
        clip.failed = True  # the first error ends the clip: its later chunks are not run
        clip.chunks_left -= 1
        self._queue = deque(item for item in self._queue if item[1].clip is not clip)
        self._session, self._next_chunk = None, 0
        if isinstance(reply, ErrorReply):
            await self._ws.send_bytes(pack(error_message(reply)))
        elif not isinstance(reply, ResetOk):
            await self._ws.send_bytes(pack({"type": "error", "code": ErrorCode.BAD_MESSAGE.value,
                                            "message": f"unexpected reply `{reply.type}`"}))
