"""DiTDeployment admission through the running app: a full graph answers busy, a freed slot admits."""
from __future__ import annotations

import asyncio

import pytest
import torch

from deployments.replicas.session_host import device_probe
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

RETRY_AFTER_S = 5.0  # SessionArgs.retry_after_s default


def test_a_session_beyond_capacity_is_busy_until_a_slot_frees(server, connect, example):
    server.wait_held(0)

    async def go():
        async with connect() as c1, connect() as c2, connect() as c3, connect() as c4, connect() as extra:
            holders = [c1, c2, c3, c4]
            for i, c in enumerate(holders):  # 2 replicas x max_sessions 2 = 4 slots
                await c.infer(f"hold{i}", example, 0, first=True)
            firsts = [await c.recv() for c in holders]
            full = server.held()
            await extra.infer("extra", example, 0, first=True)
            refused = await extra.recv()
            await c1.reset("hold0")
            await extra.infer("extra", example, 0, first=True)
            admitted = await extra.recv()
            await extra.infer("extra", example, 1, first=False)
            second = await extra.recv()
            await extra.reset("extra")
            for i, c in enumerate(holders[1:], start=1):
                await c.reset(f"hold{i}")
        return firsts, full, refused, admitted, second

    firsts, full, refused, admitted, second = asyncio.run(go())
    assert all(isinstance(r, FrameReply) for r in firsts), firsts
    assert full == {"vae": 4, "dit": 4}
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY, refused
    assert refused.retry_after_s == RETRY_AFTER_S and refused.session_id == "extra"
    assert isinstance(admitted, FrameReply) and admitted.chunk_id == 0
    assert isinstance(second, FrameReply) and second.chunk_id == 1
    assert server.held() == {"vae": 0, "dit": 0}


def test_a_session_is_capped_at_max_chunks(strict_server, strict_connect, api_keys, example):
    """sessions.max_chunks (2 in the strict app; 341 by default, the RoPE table's 1024 latent
    frames): the reply before the last chunk is followed by a `session_limit` notice (1 chunk
    left), the chunk beyond it is refused with `session_limit` (0 left); never a crash, and the
    handshake states the limit."""
    async def go():
        async with strict_connect(api_keys[4]) as c:
            replies = []
            for k in range(3):  # open-ended session (no num_frames): only the cap stops it
                extra = SessionStart(example.image, example.prompt) if k == 0 else None
                await c.send(encode(infer_request("capped", *example.chunk(k), start=extra, client_chunk_id=k)))
                replies.append(await c.recv())
        return c.config, c.notices, replies

    config, notices, replies = asyncio.run(go())
    assert config.max_chunks == 2 and config.max_latent_frames == 1024
    assert [type(r) for r in replies] == [FrameReply, FrameReply, ErrorReply], replies
    assert len(notices) == 1
    notice, refused = notices[0], replies[2]
    assert notice.code is ErrorCode.SESSION_LIMIT and notice.chunks_left == 1 and notice.is_notice
    assert "1 of its 2 chunks" in notice.message
    assert refused.code is ErrorCode.SESSION_LIMIT and refused.chunks_left == 0 and not refused.is_notice
    assert "its 2 chunks" in refused.message
    strict_server.wait_held(0)


def test_the_health_check_fails_when_the_gpu_is_unusable(monkeypatch):
    """check_health runs a tiny op on the serving device: nothing to do on CPU; a CUDA error
    (sticky after an illegal access, a lost device) fails it and Serve replaces the replica."""
    device_probe("cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "ones", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        device_probe("cuda")
