"""Worlds people share, through the real app (/resume: two ingress replicas, sessions parked
for RESUME_GRACE_S, the WorldHub deployed): share, watch, unshare; a late joiner decodes from
its first chunk; a viewer's requests are refused; tokens are checked; the owner's socket
dropped and resumed (issue 56)."""
from __future__ import annotations

import asyncio

import websockets

from media.reassembly import Fmp4Assembler, decode_fragment, split_init
from protocol import decode_reply
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import ControlRequest, ErrorReply, FrameReply, InferRequest, UnshareRequest
from protocol.sharing import Unshared, WatchRequest, Watching

from world_viewers import WATCH_PATH, Viewer, share, watch_url


def test_share_watch_unshare_same_bytes_in_order(resume_server, resume_connect, example):
    """Viewers on both ingress replicas get every chunk the owner gets, the same fMP4 bytes, in
    order; `unshare` ends their view (`ended`, the socket closed) and revokes the token."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("w1", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "w1")
            viewers, replicas = [], set()
            while len(viewers) < 4 or len(replicas) < 2:  # the proxy spreads them over both ingress replicas
                assert len(viewers) < 8, f"8 viewers all on ingress replica {replicas}"
                viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
                assert isinstance(watching, Watching) and watching.next_chunk_id == 0, watching
                viewers.append(viewer)
                replicas.add(watching.debug["ingress_replica"])
            await owner.infer("w1", example, 1, first=False)
            await owner.infer("w1", example, 2, first=False)
            own = [first, await owner.recv(), await owner.recv()]
            seen = [[await v.frame() for _ in range(3)] for v in viewers]
            await owner.send(encode(UnshareRequest(session_id="w1")))
            unshared = await owner.recv()
            ended = [await v.event("ended") for v in viewers]
            closed = []
            for v in viewers:
                try:
                    await asyncio.wait_for(v.ws.recv(), 10)
                except websockets.ConnectionClosed as e:
                    closed.append(e.rcvd.code if e.rcvd else None)
            again, refused = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await again.ws.close()
            await owner.reset("w1")
        return shared, own, seen, unshared, ended, closed, refused

    shared, own, seen, unshared, ended, closed, refused = asyncio.run(go())
    assert len(shared.watch_token) >= 22 and shared.watch_token not in shared.watch_url  # >= 128 bits, not in the URL
    assert shared.watch_url == f"{WATCH_PATH}?world={shared.world_id}"
    for frames in seen:
        assert [f.chunk_id for f in frames] == [0, 1, 2]
        assert [f.video for f in frames] == [r.video for r in own]  # the owner's very bytes
        assert all(f.session_id == shared.world_id and f.resume_token is None for f in frames)
    assert isinstance(unshared, Unshared) and unshared.world_id == shared.world_id
    assert all(n.reason == "the owner unshared it" for n in ended) and closed == [1000] * len(seen)
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.UNAUTHORIZED


def test_a_late_joiner_decodes_from_its_first_chunk(resume_server, resume_connect, example):
    """A viewer that joins after chunk 1 gets chunk 1 first, with the init segment in front:
    it decodes alone (every chunk starts with an IDR) to the owner's frames of that chunk."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("late", example, 0, first=True)
            await owner.infer("late", example, 1, first=False)
            own = [await owner.recv(), await owner.recv()]
            shared = await share(owner, "late")
            viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            first = await viewer.frame()
            await owner.infer("late", example, 2, first=False)
            own.append(await owner.recv())
            second = await viewer.frame()
            await viewer.ws.close()
            await owner.reset("late")
        return own, watching, first, second

    own, watching, first, second = asyncio.run(go())
    assert watching.next_chunk_id == 1
    assert (first.chunk_id, second.chunk_id) == (1, 2)
    init, fragment = split_init(own[0].video)
    assert first.video == init + own[1].video and second.video == own[2].video
    frames = decode_fragment(*split_init(first.video))
    assert frames.shape[0] == own[1].num_frames == 12
    assembled = Fmp4Assembler()
    assembled.append(first.video)
    assembled.append(second.video)
    assert assembled.decode_frames().shape[0] == 24  # the viewer's own file from its first chunk on


def test_a_viewer_cannot_drive_and_a_foreign_token_is_refused(resume_server, resume_connect, example):
    """A viewer's infer, control, rewind and prompt update get `forbidden` and change nothing (the
    owner's next chunk is chunk 1 and the viewer still gets it); a wrong token gets `unauthorized`
    (another principal on a `principal` share: tests/deployments/test_world_book.py)."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("drv", example, 0, first=True)
            await owner.recv()
            shared = await share(owner, "drv")
            _, wrong = await Viewer.open(resume_server, shared.world_id, "x" * 32)
            viewer, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await viewer.frame()  # the current chunk (0)
            poses, intrinsics = example.chunk(1)
            cams = {"poses": poses, "intrinsics": intrinsics}
            for fields in ({"session_id": "drv", "cameras": cams}, {"session_id": "drv", "cameras": cams,
                                                                     "prompt_update": "a storm"}):
                await viewer.ws.send(encode(validated(InferRequest, fields)))
            await viewer.ws.send(encode(ControlRequest(session_id="drv", event_id=1, keys=("w",))))
            errors = [await viewer.error(frames_ok=False) for _ in range(3)]
            await owner.infer("drv", example, 1, first=False)
            mine = await owner.recv()
            theirs = await viewer.frame()
            await viewer.ws.close()
            await owner.reset("drv")
        return wrong, errors, mine, theirs

    wrong, errors, mine, theirs = asyncio.run(go())
    assert isinstance(wrong, ErrorReply) and wrong.code is ErrorCode.UNAUTHORIZED
    assert [e.code for e in errors] == [ErrorCode.FORBIDDEN] * 3, errors
    assert isinstance(mine, FrameReply) and mine.chunk_id == 1 and theirs.video == mine.video


def test_the_owner_drops_and_resumes_viewers_see_reconnecting_then_chunks(resume_server, resume_connect, example):
    """The owner's socket drops after chunk 0 (the session parked): viewers get
    `owner_reconnecting`; the owner resumes on a new socket (any ingress replica): `owner_back`,
    then its next chunk."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("away", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "away")
            viewer, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await viewer.frame()
        away = await viewer.event("owner_reconnecting")
        async with resume_connect() as again:
            await again.infer("away", example, 1, first=False, resume_token=first.resume_token, resume_from=1)
            mine = await again.recv()
            back = await viewer.event("owner_back")
            theirs = await viewer.frame()
            await again.reset("away")
            ended = await viewer.event("ended")
        await viewer.ws.close()
        return away, mine, back, theirs, ended

    away, mine, back, theirs, ended = asyncio.run(go())
    assert away.event == "owner_reconnecting" and back.event == "owner_back"
    assert isinstance(mine, FrameReply) and mine.chunk_id == 1 and theirs.video == mine.video
    assert ended.reason == "the owner's session ended"


def test_a_viewer_that_never_reads_slows_neither_the_owner_nor_the_others(resume_server, resume_connect, example):
    """One viewer's socket never reads (its client takes one message, then nothing) while three
    others and the owner stream 3 chunks: the others get every chunk in order, as the owner does.
    (Through Serve the unread bytes first fill the TCP and proxy buffers; the bounded queue and
    its skips are shown without Ray in tests/deployments/test_world_book.py.)"""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("slow", example, 0, first=True)
            own = [await owner.recv()]
            shared = await share(owner, "slow")
            stuck = await websockets.connect(watch_url(resume_server), max_size=None, max_queue=1)
            await stuck.send(encode(WatchRequest(world_id=shared.world_id, watch_token=shared.watch_token)))
            readers = [(await Viewer.open(resume_server, shared.world_id, shared.watch_token))[0] for _ in range(3)]
            for k in range(1, 3):
                await owner.infer("slow", example, k, first=False)
            own += [await owner.recv() for _ in range(2)]
            seen = [[await v.frame() for _ in range(3)] for v in readers]
            for v in readers:
                await v.ws.close()
            await stuck.close()
            await owner.reset("slow")
        return own, seen

    own, seen = asyncio.run(go())
    assert [r.chunk_id for r in own] == [0, 1, 2]
    for frames in seen:
        assert [f.chunk_id for f in frames] == [0, 1, 2] and [f.video for f in frames] == [r.video for r in own]


def _hub_replica() -> str:
    from ray.serve.context import _get_global_client  # noqa: PLC0415

    deployments = _get_global_client().get_serve_details()["applications"]["resume"]["deployments"]
    (replica,) = [r["replica_id"] for r in deployments["WorldHub"]["replicas"] if r["state"] == "RUNNING"]
    return replica


def test_the_world_hub_killed_its_viewers_get_ended_and_the_owner_goes_on(resume_server, resume_connect, example,
                                                                           replica_killer):
    """`ray.kill` of the WorldHub's replica while a viewer watches: the viewer gets `ended` (the
    server lost the world) and its socket closes, never a silent stop; the owner's session goes
    on, and a share after Serve started the new replica makes a new world that viewers watch."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("hub", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "hub")
            viewer, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await viewer.frame()
            replica_killer("resume", "WorldHub", _hub_replica())
            ended = await viewer.event("ended", timeout=120)
            await owner.infer("hub", example, 1, first=False)
            mine = await owner.recv()
            again = await share(owner, "hub")
            second, watching = await Viewer.open(resume_server, again.world_id, again.watch_token)
            theirs = await second.frame()
            await second.ws.close()
            await viewer.ws.close()
            await owner.reset("hub")
        return first, shared, ended, mine, again, watching, theirs

    first, shared, ended, mine, again, watching, theirs = asyncio.run(go())
    assert "lost" in ended.reason or "gone" in ended.reason, ended
    assert isinstance(mine, FrameReply) and mine.chunk_id == 1
    assert again.world_id != shared.world_id and isinstance(watching, Watching) and watching.next_chunk_id == 1
    assert theirs.video == split_init(first.video)[0] + mine.video  # the new world's init came from the owner


def test_with_auth_on_a_principal_share_admits_only_the_owners_key(strict_server, strict_connect, example):
    """The strict app (API keys): a viewer without a key is refused at connect; with another key
    a `principal` share answers `unauthorized`; the owner's own key watches."""
    async def go():
        async with strict_connect("key-share") as owner:
            await owner.infer("mine", example, 0, first=True)
            await owner.recv()
            shared = await share(owner, "mine", audience="principal")
            anonymous = await websockets.connect(watch_url(strict_server), max_size=None)
            no_key = decode_reply(await asyncio.wait_for(anonymous.recv(), 30))
            _, other = await Viewer.open(strict_server, shared.world_id, shared.watch_token,
                                         {"Authorization": "Bearer key-share-2"})
            viewer, own = await Viewer.open(strict_server, shared.world_id, shared.watch_token,
                                            {"Authorization": "Bearer key-share"})
            first = await viewer.frame()
            await viewer.ws.close()
            await anonymous.close()
            await owner.reset("mine")
        return no_key, other, own, first

    no_key, other, own, first = asyncio.run(go())
    assert isinstance(no_key, ErrorReply) and no_key.code is ErrorCode.UNAUTHORIZED
    assert isinstance(other, ErrorReply) and other.code is ErrorCode.UNAUTHORIZED
    assert isinstance(own, Watching) and first.chunk_id == 0
