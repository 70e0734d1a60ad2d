"""Watch extras through the real app (issue 56): catch-up, the prompt and pause notices, a fork
of a watched world, anonymous viewers, tokens bound to one share. One app of this module
(/watchx: API keys, `sharing.anonymous_viewers` on, two ingress replicas, one DiT replica of
two slots, sessions parked for a resume); the strict app (API keys, anonymous viewers off) for the refusal."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from media.reassembly import Fmp4Assembler
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import (AckRequest, ControlRequest, ErrorReply, ForkRequest, Forked, FrameReply, Paused,
                               ResetOk, ResetRequest, UnshareRequest)
from protocol.requests import SessionStart, drive_request
from protocol.sharing import Shared, Watching
from world_viewers import Viewer as SharedViewer, share

OWNER, OTHER = "key-share", "key-share-2"
STORM = "<b>a storm</b> & <script>x</script>"  # markup: text to the viewers, never interpreted
API_KEYS_ENV = "LWF_TEST_API_KEYS"  # conftest.py sets it before Ray starts (its API_KEYS)
RESUME_GRACE_S = 4.0  # a dropped owner's session is parked this long (every test resets its sessions)


def key(k: str | None) -> dict:
    return {} if k is None else {"Authorization": f"Bearer {k}"}


@pytest.fixture(scope="module")
def watchx(extra_app, connect_url):
    """The module's app: (server, connect(key)) where connect opens its camera route with `key`."""
    from ray import serve

    app, _ = extra_app("watchx", auth={"api_keys_env": API_KEYS_ENV}, sharing={"anonymous_viewers": True},
                       dit={"num_replicas": 1}, ingress={"num_replicas": 2},
                       sessions={"resume": {"grace_s": RESUME_GRACE_S}})
    yield app, lambda k=OWNER: connect_url(app.ws, key(k))
    serve.delete("watchx")


class Viewer(SharedViewer):
    """tests/world_viewers.py's viewer, opened with a `Shared` and an API key's name."""

    @classmethod
    async def open(cls, server, shared: Shared, k: str | None = OWNER, catch_up: int = 0):
        return await super().open(server, shared.world_id, shared.watch_token, key(k), catch_up)


def decoded(videos: list[bytes]) -> np.ndarray:
    assembled = Fmp4Assembler()
    for v in videos:
        assembled.append(v)
    return assembled.decode_frames()


def test_catch_up_gives_the_last_chunks_first_and_a_late_joiner_decodes_them(watchx, example):
    """After chunks 0 and 1, a viewer asking `catch_up: 5` gets both (the hub keeps 4), then
    chunk 2 live; one asking `catch_up: 1` starts at chunk 1 (the init segment in front). Each
    viewer's bytes decode (PyAV) to the owner's frames from its first chunk on."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("cu", example, 0, first=True)
            own = [await owner.recv()]
            shared = await share(owner, "cu")
            await owner.infer("cu", example, 1, first=False)
            own.append(await owner.recv())
            full, watching_full = await Viewer.open(server, shared, catch_up=5)
            one, watching_one = await Viewer.open(server, shared, catch_up=1)
            early = [await full.frame(), await full.frame()]
            first = await one.frame()
            await owner.infer("cu", example, 2, first=False)
            own.append(await owner.recv())
            early.append(await full.frame())
            second = await one.frame()
            for v in (full, one):
                await v.ws.close()
            await owner.reset("cu")
        return own, watching_full, watching_one, early, [first, second]

    own, watching_full, watching_one, early, late = asyncio.run(go())
    assert (watching_full.next_chunk_id, watching_one.next_chunk_id) == (0, 1)
    assert [f.chunk_id for f in early] == [0, 1, 2] and [f.video for f in early] == [r.video for r in own]
    assert [f.chunk_id for f in late] == [1, 2] and late[1].video == own[2].video
    mine = decoded([r.video for r in own])
    assert mine.shape[0] == 33
    np.testing.assert_array_equal(decoded([f.video for f in early]), mine)
    np.testing.assert_array_equal(decoded([f.video for f in late]), mine[9:])  # from chunk 1 (its 12 + 12 frames)


def test_the_prompt_reaches_viewers_only_when_the_share_shows_it(watchx, example):
    """A `show_prompt` share: `watching` has the prompt, and a prompt update comes as a `prompt`
    notice (the markup as text) before the chunk that attends to it. A share without it: no
    prompt in `watching`, no `prompt` notice, the same chunks."""
    server, connect = watchx

    async def run(sid: str, show: bool):
        async with connect() as owner:
            await owner.infer(sid, example, 0, first=True)
            await owner.recv()
            shared = await share(owner, sid, show_prompt=show)
            viewer, watching = await Viewer.open(server, shared)
            await viewer.frame()
            await owner.infer(sid, example, 1, first=False, prompt_update=STORM)
            mine = await owner.recv()
            theirs = await viewer.frame()
            await viewer.ws.close()
            await owner.reset(sid)
        return shared, watching, viewer.notices, mine, theirs

    async def go():
        return await run("shown", True), await run("hidden", False)

    shown, hidden = asyncio.run(go())
    assert shown[0].show_prompt and shown[1].prompt == example.prompt
    prompts = [n for n in shown[2] if n.event == "prompt"]
    assert [n.prompt for n in prompts] == [STORM] and shown[4].video == shown[3].video
    assert not hidden[0].show_prompt and hidden[1].prompt is None
    assert all(n.event != "prompt" and n.prompt is None for n in hidden[2]) and hidden[4].video == hidden[3].video


def test_a_resumed_owner_goes_on_telling_its_prompt(watchx, example):
    """A `show_prompt` world whose owner drops and resumes on a new socket (any ingress
    replica): the new socket's prompt update still reaches the viewer as a `prompt` notice."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("back", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "back", show_prompt=True)
            viewer, watching = await Viewer.open(server, shared)
            await viewer.frame()
        await viewer.event("owner_reconnecting")
        async with connect() as again:
            await again.infer("back", example, 1, first=False, resume_token=first.resume_token, resume_from=1,
                              prompt_update=STORM)
            mine = await again.recv()
            told = await viewer.event("prompt")
            theirs = await viewer.frame()
            await again.reset("back")
        await viewer.ws.close()
        return watching, told, mine, theirs

    watching, told, mine, theirs = asyncio.run(go())
    assert watching.prompt == example.prompt and told.prompt == STORM
    assert isinstance(mine, FrameReply) and mine.chunk_id == 1 and theirs.video == mine.video


def test_viewers_see_the_owners_drive_pause_and_resume(watchx, example):
    """A driven session with no key held pauses after chunk 0 (before it is shared): `watching`
    or a notice says `paused`; keys held again: `resumed`, then chunk 1."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.send(encode(drive_request("drv", SessionStart(example.image, example.prompt, seed=3))))
            first = await owner.recv()
            assert isinstance(first, FrameReply), first
            await owner.send(encode(AckRequest(session_id="drv", chunk_id=0)))
            paused = await owner.recv()
            shared = await share(owner, "drv")
            viewer, watching = await Viewer.open(server, shared)
            await viewer.frame()
            if not watching.paused:
                await viewer.event("paused")
            await owner.send(encode(ControlRequest(session_id="drv", event_id=1, keys=["w"])))
            mine = await owner.recv()
            resumed = await viewer.event("resumed")
            theirs = await viewer.frame()
            await viewer.ws.close()
            await owner.send(encode(ResetRequest(session_id="drv")))
            while not isinstance(reply := await owner.recv(), ResetOk):  # the chunks in flight first
                assert isinstance(reply, (FrameReply, Paused)), reply
        return paused, resumed, viewer.notices, mine, theirs

    paused, resumed, notices, mine, theirs = asyncio.run(go())
    assert isinstance(paused, Paused) and resumed.event == "resumed"
    assert [n.event for n in notices].count("paused") <= 1
    assert isinstance(mine, FrameReply) and mine.chunk_id == 1 and theirs.video == mine.video


def test_a_fork_of_a_watched_world_is_the_viewers_own_and_continues_identical(watchx, example):
    """A viewer with another key forks the world after chunk 1 from a socket on the other
    ingress replica than the owner's: `forked` (next chunk 2, the world's init segment), and
    its chunk 2 for the owner's camera is the owner's chunk 2, byte for byte. Its session is
    its own: the owner's reset leaves it going on."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("src", example, 0, first=True)
            own = [await owner.recv()]
            shared = await share(owner, "src")
            await owner.infer("src", example, 1, first=False)
            own.append(await owner.recv())
            sockets = []
            for _ in range(8):  # the proxy spreads sockets over both ingress replicas
                sockets.append(connect(OTHER))
                forker = await sockets[-1].__aenter__()
                if forker.config.debug["ingress_replica"] != owner.config.debug["ingress_replica"]:
                    break
            await forker.send(encode(ForkRequest(session_id=shared.world_id, new_session_id="mine",
                                                 world_id=shared.world_id, watch_token=shared.watch_token)))
            forked = await forker.recv()
            await owner.infer("src", example, 2, first=False)
            await forker.infer("mine", example, 2, first=False)
            mine, theirs = await owner.recv(), await forker.recv()
            await owner.reset("src")
            await forker.reset("mine")
            for s in sockets:
                await s.__aexit__(None, None, None)
        return own, forked, mine, theirs, forker.config, owner.config

    own, forked, mine, theirs, forker, owner = asyncio.run(go())
    assert forker.debug["ingress_replica"] != owner.debug["ingress_replica"]
    assert isinstance(forked, Forked) and forked.session_id == "mine" and forked.next_chunk_id == 2, forked
    assert forked.init_segment == own[0].video[:len(forked.init_segment)] and forked.resume_token
    assert isinstance(theirs, FrameReply) and theirs.session_id == "mine" and theirs.chunk_id == 2, theirs
    assert theirs.video == mine.video
    np.testing.assert_array_equal(decoded([forked.init_segment, theirs.video]), decoded([r.video for r in own]
                                                                                        + [mine.video])[21:])


def test_a_principal_share_is_forked_by_its_owners_key_only(watchx, example):
    """`audience: principal`: another key's fork is `unauthorized` and nothing is made; so is a
    fork with a wrong token."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("own", example, 0, first=True)
            await owner.recv()
            shared = await share(owner, "own", audience="principal")
            async with connect(OTHER) as other:
                await other.send(encode(ForkRequest(session_id=shared.world_id, new_session_id="theirs",
                                                    world_id=shared.world_id, watch_token=shared.watch_token)))
                foreign = await other.recv()
                await other.send(encode(ForkRequest(session_id=shared.world_id, new_session_id="theirs",
                                                    world_id=shared.world_id, watch_token="x" * 32)))
                wrong = await other.recv()
            await owner.reset("own")
        return foreign, wrong

    foreign, wrong = asyncio.run(go())
    for refused in (foreign, wrong):
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.UNAUTHORIZED, refused


def test_anonymous_viewers_watch_link_shares_only_where_the_operator_allows(watchx, strict_server, strict_connect,
                                                                             example):
    """/watchx (`anonymous_viewers: true`): a viewer without a key watches a `link` share; a wrong
    key is still refused, and so is a keyless viewer of a `principal` share. The strict app
    (the default, false): a viewer without a key is refused at connect."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("anon", example, 0, first=True)
            await owner.recv()
            link = await share(owner, "anon")
            viewer, watching = await Viewer.open(server, link, k=None)
            first = await viewer.frame()
            _, wrong_key = await Viewer.open(server, link, k="not-a-key")
            await viewer.ws.close()
            await owner.reset("anon")
        async with connect() as owner:
            await owner.infer("mine", example, 0, first=True)
            await owner.recv()
            principal = await share(owner, "mine", audience="principal")
            _, keyless = await Viewer.open(server, principal, k=None)
            await owner.reset("mine")
        async with strict_connect(OWNER) as owner:
            await owner.infer("strict", example, 0, first=True)
            await owner.recv()
            strict = await share(owner, "strict")
            _, off = await Viewer.open(strict_server, strict, k=None)
            await owner.reset("strict")
        return watching, first, wrong_key, keyless, off

    watching, first, wrong_key, keyless, off = asyncio.run(go())
    assert isinstance(watching, Watching) and first.chunk_id == 0
    for refused in (wrong_key, keyless, off):
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.UNAUTHORIZED, refused


def test_a_token_opens_only_its_own_share_of_a_session(watchx, example):
    """Shared, unshared, shared again (the same session): a new world and token; the first
    token opens neither world (nor forks it), the new one watches."""
    server, connect = watchx

    async def go():
        async with connect() as owner:
            await owner.infer("inc", example, 0, first=True)
            await owner.recv()
            first = await share(owner, "inc")
            await owner.send(encode(UnshareRequest(session_id="inc")))
            await owner.recv()
            again = await share(owner, "inc")
            stale = Shared(**{**first.model_dump(), "world_id": again.world_id})
            _, old_world = await Viewer.open(server, first)
            _, new_world = await Viewer.open(server, stale)
            viewer, watching = await Viewer.open(server, again)
            await viewer.ws.close()
            await owner.send(encode(ForkRequest(session_id=again.world_id, new_session_id="f", world_id=again.world_id,
                                                watch_token=first.watch_token)))
            fork = await owner.recv()
            await owner.reset("inc")
        return first, again, old_world, new_world, watching, fork

    first, again, old_world, new_world, watching, fork = asyncio.run(go())
    assert again.world_id != first.world_id and again.watch_token != first.watch_token
    for refused in (old_world, new_world, fork):
        assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.UNAUTHORIZED, refused
    assert isinstance(watching, Watching)
