"""Server replies (PROTOCOL.md): frames, acknowledgements of resume / fork / rewind / reset,
pauses of a driven session, errors; each tagged by `type`."""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field, JsonValue, field_validator, model_validator

from camera.frames import FPS
from protocol.arrays import wire_array
from protocol.errors import ErrorCode, ProtocolError
from protocol.fields import Bin, PosesArray, _Message


class FrameReply(_Message):
    """One chunk of video: fMP4 bytes (chunk 0 starts with the init segment)."""

    type: Literal["frame"] = "frame"
    session_id: str
    chunk_id: int = Field(ge=0, description="monotonic within the session, from 0")
    video: Bin
    num_frames: int = Field(ge=1, description="9 for chunk 0, then 12")
    resolution: tuple[int, int] = Field(description="[H, W]")
    fps: int = FPS
    stage_durations: dict[str, float] = Field(
        default_factory=dict, description="seconds: text_encode, vae_encode, dit, vae_decode, mux, total")
    client_chunk_id: Optional[int] = None
    reset: bool = Field(False, description="true when a changed image/prompt started a fresh session")
    mime_type: Optional[str] = Field(None, description='MSE type, e.g. video/mp4; codecs="avc1.42C01E"')
    debug: Optional[dict[str, JsonValue]] = Field(None, description="server-side debug fields (replica ids, ...)")
    event_id: Optional[int] = Field(None, description="with `from_keys`: the `event_id` of the last `control` "
                                                      "applied to this chunk (absent: none had come); in a shared "
                                                      "world, the event id of the `player` whose control it was")
    player: Optional[str] = Field(None, description="in a shared world, whose input made this key-driven chunk: "
                                                    "`owner`, a player's viewer_id, or `crowd` (the players' keys "
                                                    "merged: no event_id)")
    voters: Optional[list[str]] = Field(None, description="a `crowd` chunk's: the players whose votes made it "
                                                          "(each voted and held a key the chunk pressed, or held "
                                                          "none when it pressed none): show them \"your input\"")
    poses: Optional[PosesArray] = Field(None, description="the chunk's poses as the server used them: the 12 "
                                                         "integrated from the keys, or the infer's `cameras.poses`")
    resume_token: Optional[str] = Field(
        None, description="on a session's first frame reply (chunk 0), where the server keeps sessions across "
                          "connections: send it with `session_id` on a new connection to continue the session "
                          "(`resume`, or an infer with it). Keep it secret: it is the session's key")
    cached: Optional[bool] = Field(None, description="true when the chunk was served from the server's prefix "
                                                     "store: an earlier session with the same inputs made it (the "
                                                     "same video bytes); absent on a chunk computed for this session")


    @field_validator("poses", mode="before")
    @classmethod
    def _poses(cls, v: object) -> Optional[np.ndarray]:
        if v is None:
            return None
        arr = wire_array(v, field="poses", code=ErrorCode.BAD_MESSAGE, kinds="iuf")
        if arr.ndim != 3 or arr.shape[1:] != (4, 4):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`poses` must be [N, 4, 4], got {list(arr.shape)}")
        return arr.astype(np.float32, copy=False)


class ResumeOk(_Message):
    """The answer to `resume` (after the replies it sent again)."""

    type: Literal["resumed"] = "resumed"
    session_id: str
    next_chunk_id: int = Field(ge=0, description="the chunk_id the next infer of the session produces")
    replayed: int = Field(ge=0, description="frame replies sent again before this message")


class Forked(_Message):
    """The answer to `fork`: the new session is held and its next infer produces `next_chunk_id`."""

    type: Literal["forked"] = "forked"
    session_id: str = Field(description="the new session (the fork's `new_session_id`)")
    parent_session_id: str = Field(description="the session it was forked from (unaffected)")
    next_chunk_id: int = Field(ge=1, description="the chunk_id the new session's next infer produces (`at_chunk`)")
    resume_token: Optional[str] = Field(None, description="a fork of a shared world only: the new session's resume "
                                                          "token (no chunk-0 reply of its will carry one)")
    init_segment: Optional[Bin] = Field(None, description="a fork of a shared world only: the fMP4 init segment "
                                                            "its frames continue (the world's)")


class Rewound(_Message):
    """The answer to `rewind`: the session's next infer produces `next_chunk_id`."""

    type: Literal["rewound"] = "rewound"
    session_id: str
    next_chunk_id: int = Field(ge=0, description="the chunk_id the session's next infer produces (`to_chunk`)")


class Paused(_Message):
    """A driven session stopped making chunks: no key is held (or, resumed on a new socket, none
    was sent yet). The next `control` with keys resumes it; frames before this one were all sent."""

    type: Literal["paused"] = "paused"
    session_id: str
    next_chunk_id: int = Field(ge=0, description="the chunk_id the session produces when it goes on")


class Queued(_Message):
    """A new session (or one that yielded its place: an `error` notice with code `yielded`)
    waits in the server's line for a place (no chunk is computed for it meanwhile); sent when
    its place changes and every few seconds. It starts (or goes on) by itself when its turn comes
    (its first frame reply follows); a client whose socket dropped while waiting sends its
    first infer (or `drive`) again with `queue_token` within the handshake's `resume_grace_s`
    and takes its place again."""

    type: Literal["queued"] = "queued"
    session_id: str
    position: int = Field(ge=1, description="1: next to start")
    eta_s: Optional[float] = Field(None, ge=0, description="expected seconds until it starts (null: no estimate "
                                                           "yet)")
    queue_token: str = Field(description="the place's token: `queue_token` of a first infer or `drive` takes this "
                                         "place again after a dropped socket")


class Saved(_Message):
    """The answer to `save`: the session's chunks so far are a world of the caller's."""

    type: Literal["saved"] = "saved"
    session_id: str
    world_id: str = Field(description="the saved world's id (`open`, `GET /v1/worlds/{id}`)")
    chunks: int = Field(ge=0, description="the chunks it holds")


class Opened(_Message):
    """The answer to `open`: the world is session `session_id` of this connection now."""

    type: Literal["opened"] = "opened"
    session_id: str
    world_id: str
    next_chunk_id: int = Field(ge=0, description="the chunk_id the session's next infer produces (the world's chunks)")
    resume_token: Optional[str] = Field(None, description="the session's resume token, as chunk 0's frame reply "
                                                          "carries it for a session started anew")
    init_segment: Optional[Bin] = Field(None, description="the world's fMP4 init segment (ftyp + moov, as its chunk 0 "
                                                          "began): a player appends it before the frames that follow")


class Reopened(_Message):
    """The answer to `reopen`: the world's inputs run again as session `session_id`; its
    `chunks` frame replies follow (chunk 0 carries the session's resume token, as for any new
    session)."""

    type: Literal["reopened"] = "reopened"
    session_id: str
    world_id: str
    chunks: int = Field(ge=1, description="the chunks the world holds: the frame replies that follow")
    changed: list[str] = Field(default_factory=list, description="the model setup's fields that differ from the "
                                                                 "world's (empty: the same setup)")


class ResetOk(_Message):
    type: Literal["reset_ok"] = "reset_ok"
    session_id: str


class ErrorReply(_Message):
    """Non-fatal error; the connection stays open."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str = Field(description="human-readable; says what to fix")
    session_id: Optional[str] = None
    retry_after_s: Optional[float] = Field(None, ge=0, description="with code busy only")
    chunks_left: Optional[int] = Field(
        None, ge=0, description="with code session_limit only: chunks the session may still produce; 1 on the "
                                "notice that follows the frame before the last one (no request failed), 0 when an "
                                "infer past the limit (`max_chunks`, or the chunks `num_frames` declared) was refused")
    world_id: Optional[str] = Field(None, description="with code world_changed only: the world to `reopen`")
    changed: Optional[list[str]] = Field(None, description="with code world_changed only: the fields of the model "
                                                           "setup that differ (e.g. model.dtype)")

    @model_validator(mode="after")
    def _retry_only_when_busy(self) -> ErrorReply:
        if (self.code is ErrorCode.BUSY) != (self.retry_after_s is not None):
            raise ValueError("retry_after_s is required with code busy and only with it")
        if self.chunks_left is not None and self.code is not ErrorCode.SESSION_LIMIT:
            raise ValueError("chunks_left comes with code session_limit only")
        if (self.world_id is not None or self.changed is not None) and self.code is not ErrorCode.WORLD_CHANGED:
            raise ValueError("world_id and changed come with code world_changed only")
        return self

    @property
    def is_notice(self) -> bool:
        """A notice (the session nears its limit, gave its place to the line, or the world store
        is behind), not the answer to a request."""
        return (self.code in (ErrorCode.YIELDED, ErrorCode.STORE_BEHIND)
                or (self.code is ErrorCode.SESSION_LIMIT and bool(self.chunks_left)))
