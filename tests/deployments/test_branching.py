"""Fork and rewind through the serving graph (issue 33): a session taken back to chunk k, or a
new session forked from its first k chunks, continues byte for byte (fMP4 included) like a
session that sent the same first k infers and then the new ones; the parent of a fork is
unaffected; bad requests get a typed error and change nothing."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, Forked, FrameReply, Rewound
from protocol.codec import encode, validated
from protocol.messages import InferRequest, ForkRequest, RewindRequest
from protocol.requests import infer_request

OTHER = 2  # chunk 1 "takes another path": the poses of chunk 2 instead of its own
LONG_FRAMES = 57  # 5 chunks, for the rolling window (6 latent frames, sink 3: it rolls from chunk 2 on)


async def chunk(c, sid: str, traj, k: int, poses_of: int | None = None, **options) -> FrameReply:
    """Send chunk k of `sid` (with the poses of chunk `poses_of`), return its reply."""
    if k == 0 and "image" not in options and options.pop("first", True):
        options = {"image": traj.image, "prompt": traj.prompt, "num_frames": traj.num_frames,
                   "translation_scale": traj.scale, **options}
    options.pop("first", None)
    poses, intrinsics = traj.chunk(k if poses_of is None else poses_of)
    await c.send(encode(validated(InferRequest, {"session_id": sid, "client_chunk_id": k, **options,
                                                 "cameras": {"poses": poses, "intrinsics": intrinsics}})))
    reply = await c.recv()
    assert isinstance(reply, FrameReply) and reply.chunk_id == k, reply
    return reply


async def session(c, sid: str, traj, poses: list[int], **first) -> list[bytes]:
    """A whole session (chunk k with the poses of chunk poses[k]), reset after; its videos."""
    videos = [(await chunk(c, sid, traj, k, p, **(first if k == 0 else {}))).video for k, p in enumerate(poses)]
    await c.reset(sid)
    return videos


async def ask(c, data: bytes):
    await c.send(data)
    return await c.recv()


def test_rewind_replays_byte_identical(server, connect, example):
    """Rewind to 1 after 3 chunks, another chunk 1, the old chunk 2 == a session that sent
    chunk 0 and then those; a rewind to 0 then gives chunk 0 (init segment too) again."""

    async def go():
        async with connect() as c:
            reference = await session(c, "ref", example, [0, OTHER, 2])
            for k in range(3):
                await chunk(c, "s", example, k)
            rewound = await ask(c, encode(RewindRequest(session_id="s", to_chunk=1)))
            again = [(await chunk(c, "s", example, 1, OTHER)).video, (await chunk(c, "s", example, 2)).video]
            to_start = await ask(c, encode(RewindRequest(session_id="s", to_chunk=0)))
            start = (await chunk(c, "s", example, 0, first=False)).video
            await c.reset("s")
            return reference, rewound, again, to_start, start

    reference, rewound, again, to_start, start = asyncio.run(go())
    assert isinstance(rewound, Rewound) and rewound.session_id == "s" and rewound.next_chunk_id == 1, rewound
    assert again == reference[1:]
    assert isinstance(to_start, Rewound) and to_start.next_chunk_id == 0, to_start
    assert start == reference[0]
    server.wait_held(0)


def test_fork_is_byte_identical_and_leaves_the_parent(server, connect, example):
    """A (chunks 0, 1) forked at 1 into B; B takes another chunk 1 and chunk 2 while A goes on
    with its chunk 2, interleaved: B == a session that sent chunk 0 then B's, A == A alone."""

    async def go():
        async with connect() as c:
            plain = await session(c, "plain", example, [0, 1, 2])
            other = await session(c, "other", example, [0, OTHER, 2])
            a = [(await chunk(c, "A", example, 0)).video, (await chunk(c, "A", example, 1)).video]
            forked = await ask(c, encode(ForkRequest(session_id="A", new_session_id="B", at_chunk=1)))
            b1 = (await chunk(c, "B", example, 1, OTHER)).video
            a2 = (await chunk(c, "A", example, 2)).video
            b2 = (await chunk(c, "B", example, 2)).video
            late = await ask(c, encode(ForkRequest(session_id="A", new_session_id="C",
                                                   at_chunk=3)))  # A's every chunk: C has nothing left to do
            await c.reset("A")
            await c.reset("B")
            await c.reset("C")
            return plain, other, [*a, a2], [b1, b2], forked, late

    plain, other, a, b, forked, late = asyncio.run(go())
    assert isinstance(forked, Forked) and (forked.session_id, forked.parent_session_id, forked.next_chunk_id) == (
        "B", "A", 1), forked
    assert b == other[1:]
    assert a == plain
    assert isinstance(late, Forked) and late.next_chunk_id == 3, late
    server.wait_held(0)


def test_a_fork_at_the_head_clones_the_live_session(server, connect, example, stats_of):
    """At the head (`at_chunk` == the chunks A produced) the DiT replica that holds A copies its
    live state (its `clone` call, counted in its stats) instead of replaying A's chunks: B then
    equals a session that sent A's chunks and then B's, and A an unforked session. A fork below
    the head still replays (no clone)."""

    def clones() -> int:
        return sum(s["calls"].get("clone", 0) for s in stats_of("lwf", "DiTDeployment"))

    async def go():
        async with connect() as c:
            plain = await session(c, "plain", example, [0, 1, 2])
            other = await session(c, "other", example, [0, 1, OTHER])
            a = [(await chunk(c, "A", example, k)).video for k in (0, 1)]
            before = await asyncio.to_thread(clones)  # (a sync Serve call: not on the loop)
            forked = await ask(c, encode(ForkRequest(session_id="A", new_session_id="B", at_chunk=2)))
            at_head = await asyncio.to_thread(clones)
            b2 = (await chunk(c, "B", example, 2, OTHER)).video
            a.append((await chunk(c, "A", example, 2)).video)
            below = await ask(c, encode(ForkRequest(session_id="A", new_session_id="C",
                                                    at_chunk=2)))  # A has 3 chunks now
            below_head = await asyncio.to_thread(clones)
            c2 = (await chunk(c, "C", example, 2, OTHER)).video
            for sid in ("A", "B", "C"):
                await c.reset(sid)
            return plain, other, a, forked, b2, below, c2, (before, at_head, below_head)

    plain, other, a, forked, b2, below, c2, (before, at_head, below_head) = asyncio.run(go())
    assert isinstance(forked, Forked) and forked.next_chunk_id == 2, forked
    assert isinstance(below, Forked) and below.next_chunk_id == 2, below
    assert (at_head, below_head) == (before + 1, before + 1)
    assert b2 == other[2] and c2 == other[2]
    assert a == plain
    server.wait_held(0)


def test_bad_fork_and_rewind_change_nothing(server, connect, example):
    """Unknown session, chunk out of range, an id in use, a chunk in flight (busy with
    retry_after_s): typed errors, and the session then continues as if none had been sent."""

    async def go():
        async with connect() as c:
            plain = await session(c, "plain", example, [0, 1, 2])
            await chunk(c, "s", example, 0)
            refused = [await ask(c, m) for m in (
                encode(RewindRequest(session_id="nobody", to_chunk=0)),
                encode(ForkRequest(session_id="nobody", new_session_id="x", at_chunk=1)),
                encode(RewindRequest(session_id="s", to_chunk=2)),
                encode(ForkRequest(session_id="s", new_session_id="x", at_chunk=2)),
                encode(ForkRequest(session_id="s", new_session_id="s", at_chunk=1)))]
            forked = await ask(c, encode(ForkRequest(session_id="s", new_session_id="b", at_chunk=1)))
            refused.append(await ask(c, encode(ForkRequest(session_id="s", new_session_id="b",
                                                           at_chunk=1))))  # "b" is held now
            await c.send(encode(infer_request("s", *example.chunk(1), client_chunk_id=1)))
            await c.send(encode(RewindRequest(session_id="s", to_chunk=0)))  # chunk 1 is in flight
            await c.send(encode(ForkRequest(session_id="s", new_session_id="y", at_chunk=1)))
            one, busy_rewind, busy_fork = [await c.recv() for _ in range(3)]
            two = await chunk(c, "s", example, 2)
            await c.reset("s")
            await c.reset("b")
            return plain, refused, forked, one, busy_rewind, busy_fork, two

    plain, refused, forked, one, busy_rewind, busy_fork, two = asyncio.run(go())
    assert all(isinstance(r, ErrorReply) and r.code is ErrorCode.BAD_MESSAGE for r in refused), refused
    assert "session_id" in refused[0].message and "1..1" in refused[3].message
    assert isinstance(forked, Forked), forked
    assert isinstance(one, FrameReply) and one.chunk_id == 1, one
    for busy in (busy_rewind, busy_fork):
        assert isinstance(busy, ErrorReply) and busy.code is ErrorCode.BUSY and busy.retry_after_s > 0, busy
    assert [one.video, two.video] == plain[1:]
    server.wait_held(0)


def test_a_session_without_journal_forks_only_at_its_head(strict_server, strict_connect, example):
    """The strict app's journal budget (1 MiB) is below one image: a rewind, or a fork below the
    head, has nothing to rebuild from and is refused saying why; a fork at the head is a copy of
    the live session on its replicas and needs no journal."""

    async def go():
        async with strict_connect() as c:
            await chunk(c, "s", example, 0, size="32*48")
            await chunk(c, "s", example, 1)
            refusals = [await ask(c, encode(RewindRequest(session_id="s", to_chunk=0))),
                        await ask(c, encode(ForkRequest(session_id="s", new_session_id="b", at_chunk=1)))]
            forked = await ask(c, encode(ForkRequest(session_id="s", new_session_id="b", at_chunk=2)))
            await c.reset("b")
            await c.reset("s")
            return refusals, forked

    refusals, forked = asyncio.run(go())
    for r in refusals:
        assert isinstance(r, ErrorReply) and r.code is ErrorCode.TOO_LARGE and "journal_max_mib" in r.message, r
    assert isinstance(forked, Forked) and forked.next_chunk_id == 2, forked
    strict_server.wait_held(0)


WINDOW_APP = "branchwin"


@pytest.fixture(scope="module")
def window_app(extra_app, api_keys):
    """A rolling window (6 latent frames, sink 3) for open-ended sessions; two sessions per API key."""
    app, _ = extra_app(WINDOW_APP, model={"local_attn_size": 6, "sink_size": 3}, dit={"num_replicas": 1},
                       auth={"api_keys_env": "LWF_TEST_API_KEYS", "max_sessions_per_key": 2})  # conftest's keys
    yield app, {"Authorization": f"Bearer {api_keys[0]}"}
    from ray import serve

    serve.delete(WINDOW_APP)


def test_rewind_and_fork_of_a_rolling_window_and_the_quota(window_app, connect_url, example):
    """Open-ended sessions (the window rolls from chunk 2 on): rewind to 3 after 5 chunks and a
    fork at 4 replay exactly; a third session of the key (a fork) gets busy and changes nothing."""
    app, headers = window_app
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
    open_ended = {"num_frames": None}

    async def go():
        async with connect_url(app.ws, headers) as c:
            reference = await session(c, "ref", traj, [0, 1, 2, 4, 3], **open_ended)
            plain = [(await chunk(c, "s", traj, k, **(open_ended if k == 0 else {}))).video for k in range(5)]
            rewound = await ask(c, encode(RewindRequest(session_id="s", to_chunk=3)))
            again = [(await chunk(c, "s", traj, 3, 4)).video, (await chunk(c, "s", traj, 4, 3)).video]
            forked = await ask(c, encode(ForkRequest(session_id="s", new_session_id="b", at_chunk=4)))
            over_quota = await ask(c, encode(ForkRequest(session_id="s", new_session_id="c", at_chunk=4)))
            b4 = (await chunk(c, "b", traj, 4, 3)).video
            await c.reset("s")
            await c.reset("b")
            return reference, plain, rewound, again, forked, over_quota, b4

    reference, plain, rewound, again, forked, over_quota, b4 = asyncio.run(go())
    assert isinstance(rewound, Rewound) and rewound.next_chunk_id == 3, rewound
    assert plain[:3] == reference[:3] and again == reference[3:]
    assert isinstance(forked, Forked), forked
    assert isinstance(over_quota, ErrorReply) and over_quota.code is ErrorCode.BUSY and over_quota.retry_after_s
    assert b4 == reference[4]  # the fork kept chunks 0..3 of the rewound session: the reference's
