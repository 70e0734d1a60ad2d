"""A session revived from the store carries the replies a resume sends again (replays.py): frame
replies of its last `sessions.resume.replay_chunks` stored chunks, their fMP4 bytes as the client
got them, with the MSE type read from chunk 0's init segment (before: none, "replayed 0")."""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from deployments.config import AppArgs
from deployments.ingress.parking import new_token, token_digest
from deployments.ingress.stream import Stream
from deployments.ingress.worlds.keeping import WorldKeeping
from deployments.ingress.worlds.replays import mime_of
from deployments.ingress.worlds.sessions import SessionWorlds
from deployments.worlds.worlds import Worlds
from media.fmp4 import Fmp4Muxer
from protocol.messages import FrameReply
from worlds_support import OPTIONS, Switchable, make_journal

CHUNKS = 5
PRINCIPAL = "addr:10.0.0.7"


def videos() -> tuple[list[bytes], str]:
    """Five chunks' fMP4 bytes as a session's client gets them (chunk 0 with the init segment)."""
    mux = Fmp4Muxer(48, 32)
    rng = np.random.default_rng(1)
    out = []
    for k in range(CHUNKS):
        frames = rng.integers(0, 255, (9 if k == 0 else 12, 32, 48, 3), dtype=np.uint8)
        out.append(mux.add_chunk(frames))
    return out, mux.mime_type


def revived(tmp_path, replay_chunks: int, clip: bool = False):
    vids, mime = videos()

    async def main():
        args = AppArgs.model_validate({"worlds": {"enabled": True},
                                       "sessions": {"resume": {"replay_chunks": replay_chunks}}})
        keeping = WorldKeeping(args, Worlds(Switchable(tmp_path)))
        journal = make_journal(CHUNKS)
        spec = dataclasses.replace(OPTIONS, raw_frames=True) if clip else OPTIONS
        stream = Stream(spec, journal, journal.image)
        token = new_token()
        worlds = SessionWorlds(keeping, PRINCIPAL, lambda n: None, lambda s: token_digest(token))
        for k in range(CHUNKS):
            worlds.kept(stream, k, vids[k])
        assert await keeping.writer.flush(30)
        parked = await worlds.revive(OPTIONS.session_id, token)
        await keeping.writer.close()
        return parked, token

    parked, token = asyncio.run(main())
    return parked, token, vids, mime


def test_a_revived_session_carries_its_last_stored_chunks_replies(tmp_path):
    parked, _, vids, mime = revived(tmp_path, replay_chunks=3)
    assert parked.next_chunk == parked.sent == CHUNKS
    assert all(isinstance(r, FrameReply) for r in parked.replies)
    assert [r.chunk_id for r in parked.replies] == [2, 3, 4]
    assert [r.video for r in parked.replies] == vids[2:]  # the bytes the client got
    assert {(r.session_id, r.num_frames, r.resolution, r.mime_type, r.resume_token) for r in parked.replies} == {
        (OPTIONS.session_id, 12, OPTIONS.resolution, mime, None)}


def test_chunk_zeros_reply_again_has_the_init_segment_nine_frames_and_the_token(tmp_path):
    parked, token, vids, mime = revived(tmp_path, replay_chunks=8)
    assert [r.chunk_id for r in parked.replies] == list(range(CHUNKS))
    first = parked.replies[0]
    assert first.video == vids[0] and first.num_frames == 9 and first.resume_token == token
    assert first.mime_type == mime


def test_none_with_replay_chunks_0_or_for_a_clip_session(tmp_path):
    assert revived(tmp_path / "a", replay_chunks=0)[0].replies == []
    assert revived(tmp_path / "b", replay_chunks=4, clip=True)[0].replies == []


def test_the_mse_type_of_an_init_segment_and_of_bytes_without_one():
    vids, mime = videos()
    assert mime_of(vids[0]) == mime and mime.startswith('video/mp4; codecs="avc1.')
    assert mime_of(vids[1]) is None and mime_of(None) is None and mime_of(b"") is None
