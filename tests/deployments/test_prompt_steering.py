"""Prompt steering through the serving graph (issue 15): `prompt_update` keeps the scene, and a
session rebuilt from its journal after an update continues bit for bit."""
from __future__ import annotations

import asyncio

IDLE_TTL_S = 10.0  # the test app's sessions.idle_ttl_s (conftest.py)
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

NEW_PROMPT = "a snowy mountain village at night, lanterns glowing"


def test_prompt_update_steers_and_survives_a_rebuild(server, connect, example):
    """Chunk 1 carries `prompt_update`. The steered session differs from the plain one only from
    chunk 1 on; after both replicas dropped it (idle TTL), chunk 2 is rebuilt from the journal
    (prompt update replayed) and equals the uninterrupted steered session byte for byte."""

    async def steered_session(c, sid: str, pause_before_last: bool) -> list:
        replies = []
        for k in range(3):
            if k == 2 and pause_before_last:
                await asyncio.sleep(IDLE_TTL_S + 4.0)  # both replicas drop the idle session
            await c.infer(sid, example, k, first=k == 0, **({"prompt_update": NEW_PROMPT} if k == 1 else {}))
            replies.append(await c.recv())
        return replies

    async def run():
        async with connect() as c:
            plain = await c.run_session("plain", example, chunks=3)
            await c.reset("plain")
            reference = await steered_session(c, "steered", False)
            await c.reset("steered")
            rebuilt = await steered_session(c, "steered-rebuilt", True)
            await c.reset("steered-rebuilt")
            return plain, reference, rebuilt

    plain, reference, rebuilt = asyncio.run(run())
    for replies in (reference, rebuilt):
        assert all(isinstance(r, FrameReply) for r in replies), replies
    assert reference[0].video == plain[0].video
    assert reference[1].video != plain[1].video  # the new prompt is seen from its chunk on
    assert rebuilt[2].debug["recoveries"] >= 1
    assert [r.video for r in rebuilt] == [r.video for r in reference]
    server.wait_held(0)


def test_prompt_update_needs_an_open_session(server, connect, example):
    async def go():
        async with connect() as c:
            start = SessionStart(example.image, example.prompt)
            await c.send(encode(infer_request("nobody", *example.chunk(0), start=start, prompt_update=NEW_PROMPT)))
            first = await c.recv()
            await c.infer("s", example, 0, first=True)
            frame = await c.recv()
            await c.send(encode(infer_request("s", *example.chunk(1), prompt="a third prompt",
                                              prompt_update=NEW_PROMPT)))
            clash = await c.recv()
            await c.reset("s")
            return first, frame, clash

    first, frame, clash = asyncio.run(go())
    assert isinstance(first, ErrorReply) and first.code is ErrorCode.BAD_MESSAGE and "prompt_update" in first.message
    assert isinstance(frame, FrameReply)
    assert isinstance(clash, ErrorReply) and clash.code is ErrorCode.BAD_MESSAGE
    server.wait_held(0)
