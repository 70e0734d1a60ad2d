"""Key control of one connection (PROTOCOL.md, `control`): the keys held and the camera they move.

`control` sets the keys held for a session id (the whole state; one per connection: a control
for another session id replaces it). An infer with `from_keys` then gets its chunk's 12 poses
from them (camera/keys.py), continuing the stream's camera: the last pose of the stream's last
chunk, explicit or key-driven. Poses are worked out when the infer is dispatched (in request
order), so pipelined infers continue each other; `commit` records them once the chunk is
accepted, so a refused infer moves nothing. The frame reply then carries the chunk's poses
and, for a key-driven chunk, the `event_id` of the key state it used.

A shared session's world may have players (sharing/policy.py): `world(session_id)` then gives
its players' inputs (sharing/inbox.py), and a key-driven chunk's keys are the world's policy's
pick (the holder's in `turns`, the crowd's merge, else the owner's), its reply's `event_id`
the one of that input and its `player` whose input it was.

A cursor holds for its stream and the chunk it was left at: after a rewind to chunk k (the
stream's `next_chunk` taken back) the camera continues from the journal's last kept chunk,
chunk k - 1's last pose, not from the chunks taken back; a fork starts from its prefix's: at
the head, the source's cursor (a branch follower, history/branching.py: a session whose journal
was dropped over its budget still forks there, and its fork must not start from the identity).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np
from pydantic import BaseModel

from camera.frames import CHUNK_VIDEO_FRAMES
from camera.keys import KeySteps, default_intrinsics_row, key_chunk_poses
from deployments.config import ControlArgs
from deployments.ingress.stream import Stream, StreamState
from protocol.messages import ControlRequest, FrameReply, InferRequest


@dataclass(frozen=True, slots=True)
class ChunkCameras:
    """The camera of one accepted chunk: what the DiT gets and what its reply reports."""

    poses: np.ndarray  # float32 [N, 4, 4]
    intrinsics: np.ndarray  # float32 [N, 4]
    event_id: Optional[int]  # the key state a key-driven chunk used (None: explicit, or no control yet)
    last_pose: np.ndarray  # float64 [4, 4]: where the next key-driven chunk continues from (poses[-1], widened)
    player: Optional[str] = None  # a shared world's key-driven chunk: whose input (`owner`, a viewer id, `crowd`)
    voters: Optional[tuple[str, ...]] = None  # a `crowd` chunk: the players whose votes made it (policy.py)


class WorldInputs(Protocol):
    """A shared session's players' inputs (sharing/inbox.py `Inbox`)."""

    def chunk_keys(self, owner_keys: Optional[tuple[str, ...]],
                   owner_event: Optional[int]) -> tuple[tuple[str, ...], Optional[int], str]: ...

    def voters(self, pressed: tuple[str, ...]) -> tuple[str, ...]: ...


@dataclass(slots=True)
class _Cursor:
    stream: Stream  # the incarnation it belongs to (a new stream starts from the identity)
    next_chunk: int  # the stream's `next_chunk` when it was left: any other value (a rewind) voids it
    pose: np.ndarray  # float64 [4, 4]
    intrinsics: np.ndarray  # float32 [4]: the row key-driven chunks use
    before: Optional["_Cursor"] = None  # the cursor this one replaced (`uncommit`)


class ControlBook:
    """The keys held (for one session id) and the camera cursor of the current stream."""

    def __init__(self, args: ControlArgs) -> None:
        self._steps = KeySteps(move=args.move, lateral=args.lateral, yaw_deg=args.yaw_deg,
                               pitch_deg=args.pitch_deg, pitch_limit_deg=args.pitch_limit_deg)
        self._session_id: Optional[str] = None
        self._keys: tuple[str, ...] = ()
        self._event_id: Optional[int] = None
        self._cursors: dict[str, _Cursor] = {}  # session_id -> cursor (the current and the forked sessions held)
        self.world: Callable[[str], Optional[WorldInputs]] = lambda session_id: None  # set by the connection

    def set(self, req: ControlRequest) -> None:
        """The keys held now for `req.session_id` (validated by the codec)."""
        self._session_id, self._keys, self._event_id = req.session_id, req.keys, req.event_id

    def forget(self, session_id: str) -> None:
        """`reset`: the session's keys are released."""
        if self._session_id == session_id:
            self._session_id, self._keys, self._event_id = None, (), None
        self._cursors.pop(session_id, None)

    def _cursor(self, stream: Stream, chunk_id: int) -> Optional[_Cursor]:
        """`stream`'s cursor while chunk `chunk_id` follows the chunk it was left at (same
        incarnation; a rewind since, or another chunk, voids it)."""
        cursor = self._cursors.get(stream.spec.session_id)
        if cursor is None or cursor.stream is not stream or cursor.next_chunk != chunk_id:
            return None
        return cursor

    def keys_for(self, session_id: str) -> tuple[str, ...]:
        """The keys held for `session_id` now (none when the control names another session)."""
        return self._keys if self._session_id == session_id else ()

    def holds_keys(self, session_id: str) -> bool:
        """Some key is held for `session_id` (a driven session goes on; none: it pauses); in a
        shared world, some key of the policy's pick (a player's keys wake it too)."""
        world = self.world(session_id)
        if world is not None:
            return bool(world.chunk_keys(self._keys if self._session_id == session_id else None, None)[0])
        return self._session_id == session_id and bool(self._keys)

    def chunk(self, stream: Stream, req: InferRequest) -> ChunkCameras:
        """The camera of `req`'s chunk on `stream` (nothing recorded: see `commit`)."""
        if req.cameras is not None:
            poses, intrinsics = req.cameras.poses, req.cameras.intrinsics
            return ChunkCameras(poses, intrinsics, None, poses[-1].astype(np.float64))
        return self.keyed(stream, stream.next_chunk)

    def keyed(self, stream: Stream, chunk_id: int) -> ChunkCameras:
        """The camera of `stream`'s chunk `chunk_id` from the keys held now (nothing recorded):
        the next chunk of an infer, or a driven chunk queued earlier and bound now."""
        cursor = self._cursor(stream, chunk_id)
        held = self._session_id == stream.spec.session_id
        keys, event_id = (self._keys, self._event_id) if held else ((), None)
        player, voters = None, None
        world = self.world(stream.spec.session_id)
        if world is not None:  # a shared world: its policy picks the keys (module doc)
            keys, event_id, player = world.chunk_keys(keys if held else None, event_id)
            voters = world.voters(keys) if player == "crowd" else None  # (the same snapshot: no await between)
        last = cursor.pose if cursor is not None else _journaled_pose(stream)
        # float32 as sent (to the DiT, in the reply, in the journal); the next chunk continues
        # from that float32 pose, not from the float64 one it was rounded from: so a stream
        # with its cursor and one continuing from its journal (a rewind, a fork below the head,
        # a resume) get the same poses, to the bit.
        poses = key_chunk_poses(last, keys, self._steps).astype(np.float32)
        row = cursor.intrinsics if cursor is not None else _journaled_intrinsics(stream)
        intrinsics = np.tile(row, (CHUNK_VIDEO_FRAMES, 1))
        return ChunkCameras(poses, intrinsics, event_id, poses[-1].astype(np.float64), player, voters)

    def commit(self, stream: Stream, cams: ChunkCameras, chunk_id: int) -> None:
        """Chunk `chunk_id` was accepted: the stream's camera continues from it."""
        sid = stream.spec.session_id
        before = self._cursor(stream, chunk_id)
        if before is not None:
            before.before = None  # one step back is all `uncommit` takes
        self._cursors = {k: c for k, c in self._cursors.items() if k != sid and c.stream.state is StreamState.OPEN}
        self._cursors[sid] = _Cursor(stream, chunk_id + 1, cams.last_pose, cams.intrinsics[0], before)

    def uncommit(self, stream: Stream, chunk_id: int) -> None:
        """Chunk `chunk_id` was given up after `commit` (preempted, drive/binding.py): the camera
        continues from where it was before it, so the chunk is bound again from there."""
        sid = stream.spec.session_id
        cursor = self._cursors.get(sid)
        if cursor is None or cursor.stream is not stream or cursor.next_chunk != chunk_id + 1:
            return
        if cursor.before is not None:
            self._cursors[sid] = cursor.before
        else:  # the chunk continued the journal's last pose (no cursor before it): so will its next try
            del self._cursors[sid]

    def forked(self, new: Stream, source: Stream, k: int) -> None:
        """A fork of `source`'s first k chunks: at its head, the fork continues the source's
        camera (below it, the fork's journal holds chunk k - 1's pose)."""
        cursor = self._cursor(source, k)
        if cursor is not None:
            self._cursors[new.spec.session_id] = _Cursor(new, k, cursor.pose.copy(), cursor.intrinsics.copy())

    def rewound(self, stream: Stream, k: int) -> None:
        """A rewind voids the cursor by itself (`next_chunk` taken back); nothing to follow."""

    @staticmethod
    async def annotate(reply_task: Awaitable[BaseModel], cams: ChunkCameras | Awaitable[ChunkCameras]) -> BaseModel:
        """The chunk's reply with its `poses` and `event_id` (errors as they are). `cams`: the
        chunk's camera, or (a driven chunk, drive/binding.py) the future it is bound on."""
        reply = await reply_task
        if isinstance(reply, FrameReply):
            if not isinstance(cams, ChunkCameras):
                cams = await cams  # bound before the chunk's step: done once its frame exists
            return reply.model_copy(update={"poses": cams.poses, "event_id": cams.event_id, "player": cams.player,
                                            "voters": None if cams.voters is None else list(cams.voters)})
        return reply


def _journaled_pose(stream: Stream) -> Optional[np.ndarray]:
    """The last pose of a stream this connection has no cursor for (one resumed from the
    parking): its journal's last chunk; None (the identity start) when it has none."""
    chunks = stream.journal.chunks
    return chunks[-1].poses[-1].astype(np.float64) if chunks else None


def _journaled_intrinsics(stream: Stream) -> np.ndarray:
    chunks = stream.journal.chunks
    if chunks:
        return chunks[-1].intrinsics[0].astype(np.float32)
    return default_intrinsics_row(stream.spec.intrinsics_resolution)
