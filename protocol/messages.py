"""Wire messages (PROTOCOL.md): client requests, server replies, each tagged by `endpoint`/`type`.

Requests validate everything that needs no server state; limits come from the validation
context (`Model.model_validate(obj, context={"limits": limits})`, `DEFAULT_LIMITS` otherwise).
Validators raise `ProtocolError` so that the codec can map each failure to its error code.
Numeric arrays are float32 numpy arrays inside the models and msgpack-numpy maps on the wire.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator

from camera.frames import MAX_CHUNKS
from camera.keys import KEY_NAMES
from camera.poses import rigid_errors
from protocol.arrays import finite_float32, wire_array
from protocol.errors import ErrorCode, ProtocolError
from protocol.fields import (_RESUME_FROM_DOC, _RESUME_TOKEN_DOC, _SIZE, ImageField, IntrinsicsArray, PosesArray,
                             PositiveInt, ResumeFrom, ResumeToken, StrictInt, _check_prompt, _limits, _Message, _Request)
from protocol.handshake import CameraServerConfig
from protocol.image import probe_image, raw_image
from protocol.limits import Limits
# the replies live in protocol/replies.py; this stays the wire's one module of messages
from protocol.replies import (ErrorReply, Forked, FrameReply, Opened, Paused, Queued, Reopened, ResetOk, ResumeOk,
                             Rewound, Saved)
# the owner's share and players' requests live with the other shared-world messages in protocol/sharing.py
from protocol.sharing import (AskControlsRequest, GrantRequest, KickRequest, PassControlsRequest, Players,
                              PromptRequest, RevokeRequest, Shared, ShareRequest, Unshared, UnshareRequest, WatchToken,
                              Watching, WorldId, WorldNotice)


class Cameras(_Message):
    """N camera poses of one chunk, evenly spaced over its 12-frame span (PROTOCOL.md §2)."""

    intrinsics: IntrinsicsArray
    poses: PosesArray

    @field_validator("intrinsics", mode="before")
    @classmethod
    def _intrinsics(cls, v: object, info: ValidationInfo) -> np.ndarray:
        arr = wire_array(v, field="cameras.intrinsics", code=ErrorCode.BAD_CAMERAS, kinds="iuf")
        _check_count(arr, "cameras.intrinsics", _limits(info))
        if arr.ndim != 2 or arr.shape[1] != 4:
            raise ProtocolError(ErrorCode.BAD_CAMERAS, "`cameras.intrinsics` must be [N, 4] "
                                                       f"(fx, fy, cx, cy), got shape {list(arr.shape)}")
        k = finite_float32(arr, field="cameras.intrinsics", code=ErrorCode.BAD_CAMERAS)
        bad = np.flatnonzero((k[:, 0] <= 0) | (k[:, 1] <= 0))
        if bad.size:
            raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`cameras.intrinsics[{bad[0]}]`: focal lengths "
                                                       "fx, fy must be > 0 (pixels)")
        return k

    @field_validator("poses", mode="before")
    @classmethod
    def _poses(cls, v: object, info: ValidationInfo) -> np.ndarray:
        limits = _limits(info)
        arr = wire_array(v, field="cameras.poses", code=ErrorCode.BAD_CAMERAS, kinds="iuf")
        _check_count(arr, "cameras.poses", limits)
        if arr.ndim != 3 or arr.shape[1:] != (4, 4):
            raise ProtocolError(ErrorCode.BAD_CAMERAS, "`cameras.poses` must be [N, 4, 4] camera-to-world "
                                                       f"matrices, got shape {list(arr.shape)}")
        poses = finite_float32(arr, field="cameras.poses", code=ErrorCode.BAD_CAMERAS)
        _check_rigid(poses, limits.rotation_tolerance)
        far = np.flatnonzero(np.abs(poses[:, :3, 3]).max(axis=1) > limits.max_translation)
        if far.size:
            raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`cameras.poses[{far[0]}]`: translation beyond "
                                                       f"{limits.max_translation:g} scene units")
        return poses

    @model_validator(mode="after")
    def _same_count(self) -> Cameras:
        if len(self.intrinsics) != len(self.poses):
            raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`cameras` has {len(self.poses)} poses but "
                                                       f"{len(self.intrinsics)} intrinsics rows; send one row per pose")
        return self


def _check_count(arr: np.ndarray, field: str, limits: Limits) -> None:
    """N (the leading dimension) must be in 1..max_poses_per_chunk."""
    n = arr.shape[0] if arr.ndim else 1
    if n == 0:
        raise ProtocolError(ErrorCode.BAD_CAMERAS, f"`{field}` is empty (N = 0); send at least one pose")
    if n > limits.max_poses_per_chunk:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{field}` has N = {n} rows; at most "
                                                 f"{limits.max_poses_per_chunk} per chunk")


def _check_rigid(poses: np.ndarray, tol: float) -> None:
    """Raise bad_cameras unless every pose [N, 4, 4] is a rotation + translation."""
    ortho, det, last_row = rigid_errors(poses)
    bad = np.flatnonzero((last_row > tol) | (ortho > tol) | (np.abs(det - 1.0) > tol))
    if bad.size:
        i = bad[0]
        raise ProtocolError(ErrorCode.BAD_CAMERAS, (
            f"`cameras.poses[{i}]` is not a rigid camera-to-world transform: the rotation must be "
            f"orthonormal with det 1 and the last row 0 0 0 1 (max|R^T R - I| = {ortho[i]:.2e}, "
            f"det R = {det[i]:.4f}, last-row error {last_row[i]:.2e}; tolerance {tol:.0e})"))


class _Opening(_Request):
    """The fields that open a session (a session's first infer, `drive`): image, prompt, options."""

    image: Optional[ImageField] = None
    prompt: Optional[Annotated[str, Strict()]] = None
    seed: Optional[Annotated[int, Strict(), Field(ge=0, le=2**64 - 1)]] = None
    size: Optional[Annotated[str, Strict()]] = Field(None, description='max output area "H*W", e.g. "480*832"')
    intrinsics_resolution: Optional[tuple[PositiveInt, PositiveInt]] = Field(
        None, description="[H, W] that `intrinsics` are expressed in")
    num_frames: Optional[StrictInt] = Field(None, description="planned total length, 4n+1")
    translation_scale: Optional[Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]] = None
    queue_token: Optional[ResumeToken] = Field(None, description="the `queue_token` of a `queued` notice: after a "
                                                                "dropped socket, takes that place in line again")

    @field_validator("image", mode="before")
    @classmethod
    def _image(cls, v: object, info: ValidationInfo) -> bytes | np.ndarray | None:
        limits = _limits(info)
        if v is None:
            return None
        if isinstance(v, bytes):
            probe_image(v, limits)  # header only: format, pixel count, min side
            return v
        if not isinstance(v, (dict, list, tuple, np.ndarray)):
            raise ProtocolError(ErrorCode.BAD_IMAGE, "`image` must be PNG/JPEG bytes (msgpack bin) "
                                                     "or a raw RGB uint8 array [H, W, 3]")
        return raw_image(wire_array(v, field="image", code=ErrorCode.BAD_IMAGE, kinds="iu"), limits)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _check_prompt(v, info)

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        m = _SIZE.fullmatch(v)
        if m is None or min(int(m[1]), int(m[2])) < 16:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, '`size` must be "H*W" with H, W >= 16, e.g. "480*832"')
        limit = _limits(info).max_output_area
        if int(m[1]) * int(m[2]) > limit:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"`size` area {int(m[1]) * int(m[2])} exceeds {limit} pixels")
        return v

    @field_validator("translation_scale")
    @classmethod
    def _translation_scale(cls, v: float | None, info: ValidationInfo) -> float | None:
        lo, hi = _limits(info).translation_scale_range
        if v is not None and not lo <= v <= hi:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`translation_scale` must be in [{lo:g}, {hi:g}] (the "
                                                       f"largest relative translation of the trajectory), got {v:.3g}")
        return v

    @field_validator("num_frames")
    @classmethod
    def _num_frames(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            return None
        if v < 1 or (v - 1) % 4:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`num_frames` must be 4n+1 (1, 5, 9, ..., 81), got {v}")
        limit = _limits(info).max_num_frames
        if v > limit:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"`num_frames` {v} exceeds {limit}")
        return v

    @property
    def max_area(self) -> int | None:
        """H*W of `size`, or None when the session keeps the server default."""
        return None if self.size is None else math.prod(int(s) for s in self.size.split("*"))


class InferRequest(_Opening):
    """Produce the next chunk. `image`/`prompt` and the session options matter on the first infer."""

    # The schema says what `_one_camera_source` checks: `cameras`, or `from_keys: true`.
    model_config = ConfigDict(**_Message.model_config, json_schema_extra={"anyOf": [
        {"required": ["cameras"]}, {"required": ["from_keys"], "properties": {"from_keys": {"const": True}}}]})

    endpoint: Literal["infer"] = "infer"
    prompt_update: Optional[Annotated[str, Strict()]] = Field(
        None, description="prompt steering, on any infer after a session's first: the session attends to this "
                          "prompt from this chunk on, keeping its scene (KV cache, image, position, noise); a changed "
                          "`prompt` without it starts a fresh session instead")
    cameras: Optional[Cameras] = Field(None, description="the chunk's camera; required unless `from_keys`")
    from_keys: Optional[Annotated[bool, Strict()]] = Field(None, description="the chunk's 12 poses come from the keys held (`control`), "
                                               "continuing from the session's last pose; not with `cameras`")
    client_chunk_id: Optional[StrictInt] = Field(None, description="echoed in the reply")
    resume_token: Optional[ResumeToken] = Field(None, description=_RESUME_TOKEN_DOC + "; this infer's chunk "
                                                "follows the chunks the server had accepted")
    resume_from: Optional[ResumeFrom] = Field(None, description=_RESUME_FROM_DOC)
    prefix_cache: Optional[Annotated[bool, Strict()]] = Field(
        None, description="on a session's first infer: false keeps the session out of the server's prefix store "
                          "(its chunks are neither served from it nor written to it); ignored on later infers")

    @field_validator("prompt_update")
    @classmethod
    def _prompt_update(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _check_prompt(v, info)

    @model_validator(mode="after")
    def _one_camera_source(self) -> InferRequest:
        if self.cameras is None and not self.from_keys:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "`cameras` is required (or `from_keys: true` to move the "
                                                         "camera by the keys held, see `control`)")
        if self.cameras is not None and self.from_keys:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "send `cameras` or `from_keys: true`, not both")
        return self


class DriveRequest(_Opening):
    """Open a session that the server runs by itself (server-paced streaming): it makes chunk
    after chunk from the keys held (`control`), pauses while none is held (`paused`), and runs
    at most `max_unacked_chunks` ahead of the client's `ack`. `image` and `prompt` are required;
    the options are those of a first infer."""

    endpoint: Literal["drive"] = "drive"

    def as_infer(self) -> InferRequest:
        """The first infer this drive stands for (its opening fields, the camera from the keys)."""
        return InferRequest.model_construct(**{name: getattr(self, name) for name in _Opening.model_fields},
                                            from_keys=True)


def require_session_start(req: _Opening) -> None:
    """Raise missing_field unless `req` can open a session (image and prompt present)."""
    missing = [name for name in ("image", "prompt") if getattr(req, name) is None]
    if missing:
        raise ProtocolError(ErrorCode.MISSING_FIELD, f"a session's first infer (or `drive`) needs `{'` and `'.join(missing)}`; "
                                                     "send them to start the session")


class ResetRequest(_Request):
    """Drop all state of the session; the reply is `reset_ok`."""

    endpoint: Literal["reset"] = "reset"


class ResumeRequest(_Request):
    """Continue a session whose socket dropped, on this connection: the replies it missed come
    again (in order), then `resumed` says which chunk the next infer produces."""

    endpoint: Literal["resume"] = "resume"
    resume_token: ResumeToken = Field(description=_RESUME_TOKEN_DOC)
    resume_from: Optional[ResumeFrom] = Field(None, description=_RESUME_FROM_DOC)


AtChunk = Annotated[int, Strict(), Field(ge=1, le=MAX_CHUNKS)]
ToChunk = Annotated[int, Strict(), Field(ge=0, le=MAX_CHUNKS)]


class ForkRequest(_Request):
    """Branch a session: a new session `new_session_id` on this connection continues from this
    one's state after chunk `at_chunk` - 1 (its first infer produces chunk `at_chunk`); this one
    is unaffected. The reply is `forked`. With `world_id` + `watch_token` (and no `at_chunk`)
    it forks a shared world the caller may watch, at its head: `session_id` names that world
    (its frame replies' `session_id`, = `world_id`) and the new session is the caller's own."""

    endpoint: Literal["fork"] = "fork"
    new_session_id: Annotated[str, Strict()] = Field(description="the new session's id: non-empty, not in use on "
                                                                 "this connection; at most 128 chars by default")
    at_chunk: Optional[AtChunk] = Field(None, description="chunks of this session the new one keeps: 1 ..= the "
                                                          "chunks it produced (absent only with `watch_token`)")
    world_id: Optional[WorldId] = Field(None, description="a shared world to fork at its head (with `watch_token`)")
    watch_token: Optional[WatchToken] = Field(None, description="the shared world's token (PROTOCOL.md `share`)")

    @field_validator("new_session_id")
    @classmethod
    def _new_session_id(cls, v: str, info: ValidationInfo) -> str:
        return cls._session_id(v, info)

    @model_validator(mode="after")
    def _source(self) -> "ForkRequest":
        if self.watch_token is None and self.world_id is None:
            if self.at_chunk is None:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "`fork` needs `at_chunk` (or `world_id` and `watch_token` "
                                                           "to fork a shared world)", self.session_id)
            return self
        if self.watch_token is None or self.world_id is None or self.at_chunk is not None \
                or self.session_id != self.world_id:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "a fork of a shared world has `world_id` and `watch_token`, "
                                                       "`session_id` = `world_id`, and no `at_chunk` (it forks the "
                                                       "world's head)", self.session_id)
        return self

    @property
    def of_world(self) -> bool:
        """A fork of a shared world (deployments/ingress/sharing/fork.py), not of an own session."""
        return self.watch_token is not None


class RewindRequest(_Request):
    """Take chunks back: the session returns to its state after chunk `to_chunk` - 1 (0: as
    opened from its image) and its next infer produces chunk `to_chunk` again. The reply is
    `rewound`."""

    endpoint: Literal["rewind"] = "rewind"
    to_chunk: ToChunk = Field(description="the chunk_id the next infer produces: 0 ..= the chunks it produced")


MAX_TITLE_CHARS = 200  # a saved world's title
MAX_WORLD_ID_CHARS = 64  # a world id is 25 characters (`w` + 24 hex digits); longer is never one


class SaveRequest(_Request):
    """Save the session this connection holds as a world of its own (its chunks so far, in the
    server's world store, under the caller's API key or address): the reply is `saved`."""

    endpoint: Literal["save"] = "save"
    title: Annotated[str, Strict(), Field(max_length=MAX_TITLE_CHARS)] = Field(
        "", description="a name for people (at most 200 chars)")


class OpenRequest(_Request):
    """Open a saved world of the caller's as session `session_id` on this connection (in place
    of its current one): rebuilt from the store, it continues from the world's last chunk. The
    reply is `opened`; infers (keys or cameras) go on from its `next_chunk_id`."""

    endpoint: Literal["open"] = "open"
    world_id: Annotated[str, Strict(), Field(min_length=1, max_length=MAX_WORLD_ID_CHARS)] = Field(
        description="a world's id, as `saved` or `GET /v1/worlds` gave it")


class ReopenRequest(_Request):
    """Run a saved world's inputs again through the model served now, from its first chunk, as
    the new session `session_id` of this connection (in place of its current one): for a world
    `open` refuses as `world_changed`. The reply is `reopened`, then one frame reply per chunk
    of the world: new chunks, made by the served model, not the stored ones (not byte-identical
    where the model setup changed)."""

    endpoint: Literal["reopen"] = "reopen"
    world_id: Annotated[str, Strict(), Field(min_length=1, max_length=MAX_WORLD_ID_CHARS)] = Field(
        description="a world's id, as `saved`, `GET /v1/worlds` or a `world_changed` error gave it")


MAX_CONTROL_KEYS = 32  # entries of one `control.keys` (there are 14 distinct keys)


class ControlRequest(_Request):
    """The keys held now (the whole state: a key not listed is released). An infer with
    `from_keys` then moves the camera by them (camera/keys.py); frame replies echo `event_id`."""

    endpoint: Literal["control"] = "control"
    event_id: Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)] = Field(
        description="the client's id of this key state; the frame replies of chunks made with it carry it")
    keys: tuple[str, ...] = Field(description=f"held keys, any case: {', '.join(KEY_NAMES)}; [] releases all")

    @field_validator("keys", mode="before")
    @classmethod
    def _keys(cls, v: object) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(k, str) for k in v):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "`keys` must be a list of key names")
        if len(v) > MAX_CONTROL_KEYS:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"`keys` has {len(v)} entries; at most {MAX_CONTROL_KEYS}")
        keys = {k.lower() for k in v}
        unknown = sorted(keys - set(KEY_NAMES))
        if unknown:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`keys` holds {len(unknown)} unknown key name(s); the keys "
                                                       f"are {', '.join(KEY_NAMES)}")
        return tuple(k for k in KEY_NAMES if k in keys)


class AckRequest(_Request):
    """A driven session's frame replies received up to `chunk_id` (cumulative): the server runs at
    most `max_unacked_chunks` chunks ahead of the last ack."""

    endpoint: Literal["ack"] = "ack"
    chunk_id: Annotated[int, Strict(), Field(ge=0, le=MAX_CHUNKS)] = Field(
        description="the highest chunk_id whose frame reply the client has (every lower one too)")


Request = Union[InferRequest, ResetRequest, ResumeRequest, ForkRequest, RewindRequest, ControlRequest, DriveRequest,
                AckRequest, ShareRequest, UnshareRequest, SaveRequest, OpenRequest, ReopenRequest, AskControlsRequest,
                PassControlsRequest, GrantRequest, RevokeRequest, KickRequest, PromptRequest]
Reply = Annotated[Union[CameraServerConfig, FrameReply, ResetOk, ResumeOk, Forked, Rewound, Paused, Queued,
                        Saved, Opened, Reopened, ErrorReply, Shared, Unshared, Watching, WorldNotice, Players],
                  Field(discriminator="type")]
REQUEST_TYPES: dict[str, type[Request]] = {
    "infer": InferRequest, "reset": ResetRequest, "resume": ResumeRequest, "fork": ForkRequest,
    "rewind": RewindRequest, "control": ControlRequest, "drive": DriveRequest, "ack": AckRequest,
    "share": ShareRequest, "unshare": UnshareRequest, "save": SaveRequest, "open": OpenRequest,
    "reopen": ReopenRequest, "ask_controls": AskControlsRequest, "pass_controls": PassControlsRequest,
    "grant": GrantRequest, "revoke": RevokeRequest, "kick": KickRequest, "prompt": PromptRequest}
