"""What a client takes from a server: every frame checked before a reply is used, kept or
written, so that a broken or hostile server ends the client's work with one `BadReply`
(client/errors.py) instead of a bare ValueError, a file of its bytes or the memory of a huge frame.

- Size: a frame is at most `reply_max_bytes` of the server's handshake (one chunk's raw RGB
  frames at the largest output it states, beside a request's `max_message_bytes`); websockets
  refuses a longer one before reading it (its `max_size`: `DEFAULT_REPLY_MAX_BYTES`, a default
  server's, until the handshake is read).
- Sessions: a reply names a session this client named in a request (`session_id`, a fork's
  `new_session_id`), on this connection or one before it (`reconnect`).
- Chunk ids: a session's frames come in sequence, below the handshake's `max_chunks`: from 0
  (or the `next_chunk_id` of a `forked`, `rewound`, `resumed` or `opened`), one up each; from 0 again
  after `reset_ok`, `session_lost` or a frame with `reset`. While a resume is answered (its
  replies sent again, some maybe no longer kept) they only rise.
- Frames: `num_frames` as the handshake states (9 for chunk 0, then 12); the video fMP4
  (media/fragment_check.py: chunk 0 with its init segment).

A viewer of a shared world (the watch route: no handshake, no request of its own after
`watch`) is checked by `WatchGuard`: the first reply is `watching` (or the refusal), then frames
of that world only (`session_id` = its id; ids below `max_chunks`, rising except when the owner
rewinds, so any id is taken), the first one starting with the init segment, and its notices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import msgpack

from camera.frames import MAX_CHUNKS
from client.errors import BadReply, shown
from media.fragment_check import fragment_problem
from protocol.codec import decode_reply
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import (CameraServerConfig, ErrorReply, Forked, FrameReply, Opened, Reopened, Reply, ResetOk,
                               ResumeOk, Rewound)
from protocol.sharing import Watching, WorldNotice

MIB = 1 << 20
HARD_MAX_REPLY_BYTES = 256 * MIB  # whatever a handshake says: 1024x1792 chunks of 12 frames are 66 MB raw
MIN_REPLY_BYTES = 1 * MIB  # a handshake, an error reply


def reply_max_bytes(config: CameraServerConfig) -> int:
    """The largest frame a server with this handshake sends: a reply carries one chunk's video,
    which H.264 keeps below its frames' raw RGB bytes (at the largest output area it states),
    and fields no larger than a request may be (`max_message_bytes`)."""
    areas = [config.max_output_area, config.image_resolution[0] * config.image_resolution[1],
             *(h * w for h, w in config.size_buckets or ())]
    frames = max(config.chunk_video_frames, config.first_chunk_video_frames)
    return max(MIN_REPLY_BYTES, min(config.max_message_bytes + 3 * max(areas) * frames, HARD_MAX_REPLY_BYTES))


DEFAULT_REPLY_MAX_BYTES = reply_max_bytes(CameraServerConfig(model="default"))  # 12 MiB + 1280x720x3x12: ~44 MiB


def limit_frames(ws: object, max_bytes: int) -> None:
    """Set an open websockets connection's incoming message limit (the handshake's, after the
    default it was opened with): `max_message_size` of websockets 16+, `max_size` before."""
    protocol = getattr(ws, "protocol", None)
    for name in ("max_message_size", "max_size"):
        if isinstance(getattr(protocol, name, None), int):
            setattr(protocol, name, max_bytes)
            return


@dataclass
class _Sequence:
    next: int  # the chunk id the session's next frame has (exact), or at least has (rising)
    exact: bool = True  # False while a resume is answered


class ReplyGuard:
    """One client's record of the sessions it named and where each is; `take` checks a frame."""

    def __init__(self) -> None:
        self.config: Optional[CameraServerConfig] = None  # the handshake, once read
        self._named: set[str] = set()
        self._sequences: dict[str, _Sequence] = {}

    @property
    def max_bytes(self) -> int:
        return DEFAULT_REPLY_MAX_BYTES if self.config is None else reply_max_bytes(self.config)

    def sent(self, data: bytes) -> None:
        """A request about to be sent (packed): the sessions it names, where a resume starts."""
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception:  # noqa: BLE001 (not a request: the server answers it with no session)
            return
        if not isinstance(fields, dict):
            return
        names = [v for v in (fields.get("session_id"), fields.get("new_session_id")) if isinstance(v, str)]
        self._named.update(names)
        sid, endpoint = fields.get("session_id"), fields.get("endpoint", "infer")
        if not isinstance(sid, str):
            return
        if endpoint == "resume" or (endpoint in ("infer", "drive") and fields.get("resume_token")):
            start = fields.get("resume_from")
            self._sequences[sid] = _Sequence(start if isinstance(start, int) and start >= 0 else 0, exact=False)
        elif endpoint in ("infer", "drive"):
            self._sequences.setdefault(sid, _Sequence(0))

    def take(self, data: object) -> Reply:
        """One frame from the server -> its reply, checked (`BadReply` otherwise)."""
        if not isinstance(data, bytes):
            raise BadReply("the server sent a text frame; replies are binary msgpack")
        limit = self.max_bytes
        if len(data) > limit:
            raise BadReply(f"a reply of {len(data)} bytes, over the {limit} this server's handshake allows")
        try:
            reply = decode_reply(data, max_bytes=limit)
        except ProtocolError as e:
            raise BadReply(e.message) from None
        self._check(reply)
        return reply

    def _check(self, reply: Reply) -> None:
        sid = getattr(reply, "session_id", None)
        if sid is not None and sid not in self._named:
            raise BadReply(f"a `{reply.type}` reply for session {shown(sid)}, which this client did not open")
        if isinstance(reply, Forked):
            if reply.parent_session_id not in self._named:
                raise BadReply(f"`forked` from session {shown(reply.parent_session_id)}, which this client did "
                               "not open")
            self._sequences[sid] = _Sequence(reply.next_chunk_id)
        elif isinstance(reply, (Rewound, ResumeOk, Opened)):  # an opened world goes on from its chunks
            self._sequences[sid] = _Sequence(reply.next_chunk_id)
        elif isinstance(reply, Reopened):  # a new session: its chunks from 0
            self._sequences[sid] = _Sequence(0)
        elif isinstance(reply, ResetOk) or (isinstance(reply, ErrorReply) and sid is not None
                                            and reply.code is ErrorCode.SESSION_LOST):
            self._sequences[sid] = _Sequence(0)
        elif isinstance(reply, FrameReply):
            self._frame(reply)

    def _frame(self, reply: FrameReply) -> None:
        sid, k = reply.session_id, reply.chunk_id
        what = f"chunk {k} of session {shown(sid)}"
        bound = MAX_CHUNKS if self.config is None else self.config.max_chunks
        if k >= bound:
            raise BadReply(f"{what}: a session has at most {bound} chunks (the handshake's `max_chunks`)")
        seq = self._sequences.get(sid, _Sequence(0))
        if not (reply.reset and k == 0):  # else a changed image or prompt started the session afresh
            if seq.exact and k != seq.next:
                raise BadReply(f"{what} out of sequence: chunk {seq.next} comes next")
            if not seq.exact and k < seq.next:
                raise BadReply(f"{what} out of sequence: chunk {seq.next} or later comes next")
        config = self.config or CameraServerConfig(model="default")
        frames = config.first_chunk_video_frames if k == 0 else config.chunk_video_frames
        if reply.num_frames != frames:
            raise BadReply(f"{what} has {reply.num_frames} frames; the handshake says {frames}")
        problem = fragment_problem(bytes(reply.video), first=k == 0)
        if problem is not None:
            raise BadReply(f"{what}: its video is not fragmented MP4 ({problem})")
        self._sequences[sid] = _Sequence(k + 1, seq.exact)


class WatchGuard:
    """A viewer's record of the world it asked for; `take` checks a frame (module doc)."""

    def __init__(self, world_id: str, max_bytes: int = DEFAULT_REPLY_MAX_BYTES) -> None:
        self.world_id = world_id
        self.max_bytes = max_bytes  # no handshake on the watch route: a default server's frame bound
        self.watching: Optional[Watching] = None
        self.frames = 0

    def take(self, data: object) -> Reply:
        if not isinstance(data, bytes):
            raise BadReply("the server sent a text frame; replies are binary msgpack")
        if len(data) > self.max_bytes:
            raise BadReply(f"a reply of {len(data)} bytes, over the {self.max_bytes} a viewer takes")
        try:
            reply = decode_reply(data, max_bytes=self.max_bytes)
        except ProtocolError as e:
            raise BadReply(e.message) from None
        if isinstance(reply, ErrorReply):
            return reply
        if self.watching is None:
            if not isinstance(reply, Watching) or reply.world_id != self.world_id:
                raise BadReply(f"expected `watching` for world {shown(self.world_id)}, got "
                               f"`{reply.type}`{'' if not isinstance(reply, Watching) else ' of another world'}")
            self.watching = reply
            return reply
        if isinstance(reply, WorldNotice):
            if reply.world_id != self.world_id:
                raise BadReply(f"a `world` notice of world {shown(reply.world_id)}, which this viewer does not watch")
            return reply
        if not isinstance(reply, FrameReply):
            raise BadReply(f"a viewer gets frames and `world` notices, not `{reply.type}`")
        self._frame(reply)
        return reply

    def _frame(self, reply: FrameReply) -> None:
        k = reply.chunk_id
        what = f"chunk {k} of world {shown(reply.session_id)}"
        if reply.session_id != self.world_id:
            raise BadReply(f"{what}, which this viewer does not watch")
        if k >= MAX_CHUNKS:
            raise BadReply(f"{what}: a session has at most {MAX_CHUNKS} chunks")
        default = CameraServerConfig(model="default")
        frames = default.first_chunk_video_frames if k == 0 else default.chunk_video_frames
        if reply.num_frames != frames:
            raise BadReply(f"{what} has {reply.num_frames} frames; a chunk {k} has {frames}")
        problem = fragment_problem(bytes(reply.video), first=self.frames == 0)
        if problem is not None:
            if self.frames == 0:
                problem = problem.replace("chunk 0 does not", "the first frame reply does not")
            raise BadReply(f"{what}: its video is not fragmented MP4 ({problem})")
        self.frames += 1
