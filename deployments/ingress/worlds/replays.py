"""The replies a session resumed from the store sends again (revive.py), from its stored chunks.

A parked session keeps its last `sessions.resume.replay_chunks` sent replies and every unsent
one (resume.py); a session revived from the store has none of them in memory, but its world
keeps each chunk's fMP4 bytes as the client got them (written when the reply was built, sent or
not). So the revived session carries a frame reply for each of its last `replay_chunks` stored
chunks that has its video: its session and chunk id, the fMP4 bytes, the frames it decodes to
(9 for chunk 0, then 12), the resolution and the MSE type read from chunk 0's init segment
(chunk 0's reply carries the resume token, as it did). A resume with `resume_from` k sends those
from k on again, before `resumed`, as a parked session's. What a reply had beyond its video
(stage durations, debug fields, a key-driven chunk's `poses` and `event_id`) is not stored and
is absent; a clip session (raw frames, not kept for re-sending either when parked) gets none.
"""
from __future__ import annotations

from typing import Optional

from camera.frames import chunk_video_frames
from deployments.worlds.worlds import World
from media.reassembly import split_init
from protocol.messages import FrameReply


def mime_of(video: Optional[bytes]) -> Optional[str]:
    """`video/mp4; codecs="avc1.PPCCLL"` from chunk 0's init segment (its avcC record); None
    where there is none (no video kept, raw frames)."""
    try:
        init = None if video is None else split_init(video)[0]
    except ValueError:
        return None
    at = -1 if init is None else init.find(b"avcC")
    if at < 0 or len(init) < at + 8:
        return None
    p, c, lv = init[at + 5], init[at + 6], init[at + 7]  # after the record's version byte
    return f'video/mp4; codecs="avc1.{p:02X}{c:02X}{lv:02X}"'


def stored_replies(world: World, session_id: str, token: str, keep: int, clip: bool) -> list[FrameReply]:
    """Frame replies of the world's last `keep` chunks with a video (see the module doc)."""
    if clip or keep <= 0 or not world.chunks:
        return []
    mime = mime_of(world.chunks[0].video)
    resolution = (world.manifest.height, world.manifest.width)
    return [FrameReply(session_id=session_id, chunk_id=c.index, video=c.video, num_frames=chunk_video_frames(c.index),
                       resolution=resolution, mime_type=mime, resume_token=token if c.index == 0 else None)
            for c in world.chunks[-keep:] if c.video]
