"""A director's prompt and a chunk the key's quota refused, through an app with API keys and
`auth.chunks_per_minute` 8 (conftest.py `quota_server`): the owner's side reads the director's prompt for its next chunk
and takes it only once that chunk is accepted, so a refused chunk leaves it for the next one
(issue 56, "Players"). The director's prompt through the app without quotas:
test_sharing_players.py."""
from __future__ import annotations

import asyncio

from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, GrantRequest, PromptRequest
from protocol.sharing import Players, WorldNotice
from world_viewers import Viewer, share

KEY = "key-steer"
HEADERS = {"Authorization": f"Bearer {KEY}"}
NEW_PROMPT = "a snowy mountain village at night, lanterns glowing"
DELIVERY_S = 3.0  # a director's prompt reaches the owner's side well within it (two Ray calls)
MAX_BURN = 40  # chunks at most before the key's quota answers `busy` (8 a minute)


async def chunk(client, sid: str, example) -> FrameReply | ErrorReply:
    """A one-chunk session `sid` on `client` (reset after): its reply."""
    await client.infer(sid, example, 0, first=True)
    reply = await client.recv()
    await client.reset(sid)
    return reply


async def spend_quota(burner, example) -> None:
    """Spend the key's chunks until the bucket is empty right now: after its first `busy`, wait
    for one more chunk's token and spend it, so that the next infer waits a whole interval."""
    for s in range(MAX_BURN):
        reply = await chunk(burner, f"b{s}", example)
        if isinstance(reply, ErrorReply):
            assert reply.code is ErrorCode.BUSY and reply.retry_after_s, reply
            await asyncio.sleep(reply.retry_after_s + 0.1)
            assert isinstance(await chunk(burner, "last", example), FrameReply)
            return
    raise AssertionError(f"the key's quota never answered in {MAX_BURN} chunks")


def test_a_directors_prompt_stays_pending_through_a_chunk_the_quota_refused(quota_server, quota_connect, example):
    """The director's prompt reached the owner's side; the owner's next infer is refused by the
    key's quota (`busy`); sent again once the quota allows, that chunk attends to the director's
    prompt: the viewers of the `show_prompt` share get `prompt` with it before chunk 1. Before:
    the refused infer had taken the prompt, and chunk 1 attended to the session's own prompt."""
    async def go():
        async with quota_connect(KEY) as owner, quota_connect(KEY) as burner:
            await owner.infer("dir", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "dir", audience="principal", show_prompt=True)
            viewer, watching = await Viewer.open(quota_server, shared.world_id, shared.watch_token, HEADERS)
            await owner.send(encode(GrantRequest(session_id="dir", viewer_id=watching.viewer_id, director=True)))
            named = await owner.recv()
            await viewer.ws.send(encode(PromptRequest(session_id=shared.world_id, prompt=NEW_PROMPT)))
            await asyncio.sleep(DELIVERY_S)  # viewer -> hub -> the owner's inbox (no reply to wait for)
            await spend_quota(burner, example)
            await owner.infer("dir", example, 1, first=False)
            refused = await owner.recv()
            await asyncio.sleep((refused.retry_after_s or 0.0) + 0.1)
            await owner.infer("dir", example, 1, first=False)
            made = await owner.recv()
            seen = await viewer.frame()
            while seen.chunk_id < 1:
                seen = await viewer.frame()
            await viewer.ws.close()
            await owner.reset("dir")
        return first, named, refused, made, viewer.notices

    first, named, refused, made, notices = asyncio.run(go())
    assert isinstance(first, FrameReply) and isinstance(named, Players) and named.director is not None
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY, refused
    assert isinstance(made, FrameReply) and made.chunk_id == 1, made
    prompts = [n.prompt for n in notices if isinstance(n, WorldNotice) and n.event == "prompt"]
    assert prompts == [NEW_PROMPT], notices  # chunk 1 attended to the director's prompt
