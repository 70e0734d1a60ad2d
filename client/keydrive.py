"""Drive a session with keys, client-paced: a `control` whenever the key state changes, then one
`from_keys` infer per chunk (the server integrates the keys into the chunk's poses).

Each frame reply made from this client's keys must echo the `event_id` of the last control
sent before its infer (the server applies a control at the next infer it dispatches). The
control lag of a key state is the time from sending its control to receiving the first frame
whose `event_id` includes it, the number a person at the keys feels.

In a world the session shares with players (PROTOCOL.md "Players"), a frame may be made from
another's input: its `player` is a player's viewer_id (with that player's own `event_id`) or
`crowd` (the players' keys merged, no `event_id`). Such a frame is counted as theirs
(`KeyDriveLog.players`), its `event_id` is not checked against this client's, and it measures
no lag: this client's key states wait for the first frame of its own (`player` absent or
`owner`) that echoes them.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

from camera.frames import CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES
from camera.keys import KeySteps
from client.errors import BadReply
from client.session import WorldClient
from client.stats import ChunkStat
from client.streaming import StreamResult
from protocol.messages import FrameReply
from protocol.requests import SessionStart

# A full-speed step between latent frames (4 video frames of the default `controls.move`)
# becomes 1, as in the reference's normalisation (the web page declares the same).
KEYS_TRANSLATION_SCALE = 4 * KeySteps().move


def keys_num_frames(chunks: int) -> int:
    """The `num_frames` of a session of `chunks` chunks (9 + 12 per chunk after the first)."""
    return FIRST_CHUNK_VIDEO_FRAMES + CHUNK_VIDEO_FRAMES * (chunks - 1)


OWNER = "owner"  # a frame's `player` when the session's own keys made it (absent: not shared)


def own_frame(reply: FrameReply) -> bool:
    """Whether this client's keys made the frame (not a player's, nor the crowd's)."""
    return reply.player in (None, OWNER)


@dataclass
class KeyDriveLog:
    """What a drive sent and what the frames said about it."""

    event_ids: list[Optional[int]] = field(default_factory=list)  # per chunk, as echoed (a player's on its chunk)
    players: list[str] = field(default_factory=list)  # per chunk: `owner` (this client's keys), a viewer_id, `crowd`
    control_lags_s: list[float] = field(default_factory=list)  # per key state, in order (own frames only)

    @property
    def others_chunks(self) -> int:
        """Chunks made from another's input (a player, the crowd)."""
        return sum(p != OWNER for p in self.players)


async def drive_keys(client: WorldClient, session_id: str, chunk_keys: Sequence[tuple[str, ...]], *,
                     into: StreamResult, first_chunk: int = 0, first_event_id: int = 1,
                     start: Optional[SessionStart] = None, prompt_update: Optional[str] = None,
                     on_chunk: Optional[Callable[[ChunkStat, FrameReply], None]] = None,
                     reply_timeout_s: Optional[float] = None,
                     clock: Callable[[], float] = time.perf_counter) -> KeyDriveLog:
    """Chunks `first_chunk`, ... of `session_id`, chunk i with `chunk_keys[i]` held; the video
    and stats go `into`. `start` (a new session) or `prompt_update` (a branch) go with the
    first infer. `ServerError` on an error reply (`BadReply`: a wrong chunk, or a frame of its
    own keys with a wrong echo; a frame of another's input is logged as theirs: module doc)."""
    log = KeyDriveLog()
    event_id, held = first_event_id - 1, None
    pending: list[tuple[int, float]] = []  # (event_id, sent at) of controls no frame has shown yet
    for i, keys in enumerate(chunk_keys):
        if keys != held:
            event_id, held = event_id + 1, keys
            pending.append((event_id, clock()))
            await client.control(session_id, keys, event_id)
        sent_at = clock()
        reply = await client.infer_keys(session_id, timeout_s=reply_timeout_s, start=start if i == 0 else None,
                                        prompt_update=prompt_update if i == 0 else None)
        now = clock()
        expected_chunk = first_chunk + i
        mine = own_frame(reply)
        if reply.chunk_id != expected_chunk or (mine and reply.event_id != event_id):
            raise BadReply(f"expected chunk {expected_chunk} made with event {event_id}, "
                           f"got chunk {reply.chunk_id} with event {reply.event_id}")
        log.event_ids.append(reply.event_id)
        log.players.append(OWNER if mine else str(reply.player))
        if mine:  # another's frame says nothing of this client's keys: they wait for its own
            log.control_lags_s += [now - t for e, t in pending if e <= reply.event_id]
            pending = [(e, t) for e, t in pending if e > reply.event_id]
        stat = ChunkStat(i, reply.num_frames, sent_at, now, dict(reply.stage_durations), bool(reply.cached))
        into.video.append(reply.video)
        into.stats.append(stat)
        if on_chunk is not None:
            on_chunk(stat, reply)
    return log
