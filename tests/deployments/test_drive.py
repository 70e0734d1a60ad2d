"""Server-paced streaming through the running app (PROTOCOL.md, `drive`): the frames echo the
last control applied and carry the poses of the documented formula, a session pauses while no
key is held and goes on with the next control, never runs more than `max_unacked_chunks` ahead
of the acks, is driven again (paused) when resumed on a new socket, refuses bad controls, acks
and infers with typed errors and goes on, and is released when its socket drops mid-chunk.
The scheduling against fake deployments: test_driver.py."""
from __future__ import annotations

import asyncio

import msgpack
import numpy as np

from camera.keys import KeySteps, key_chunk_poses
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, Paused, ResetOk, ResumeOk
from protocol.codec import encode
from protocol.messages import ResetRequest, ResumeRequest, ControlRequest, AckRequest
from protocol.requests import SessionStart, infer_request, drive_request

STEPS = KeySteps()
QUIET_S = 4.0  # longer than a tiny chunk on a loaded 2-core machine: nothing may come meanwhile


async def recv_frame(c, ack: bool = True) -> FrameReply:
    reply = await c.recv()
    assert isinstance(reply, FrameReply), reply
    if ack:
        await c.send(encode(AckRequest(session_id=reply.session_id, chunk_id=reply.chunk_id)))
    return reply


async def reset(c, sid: str) -> None:
    """Reset a driven session: the frames of the chunks in flight may come before `reset_ok`."""
    await c.send(encode(ResetRequest(session_id=sid)))
    while not isinstance(reply := await c.recv(), ResetOk):
        assert isinstance(reply, (FrameReply, Paused)), reply


async def nothing_for(c, seconds: float) -> None:
    try:
        reply = await c.recv(timeout=seconds)
    except asyncio.TimeoutError:
        return
    raise AssertionError(f"expected silence, got {reply!r}")


def expected_poses(replies: list[FrameReply], keys_of: dict) -> list[np.ndarray]:
    """The poses the formula gives for each reply, from its event_id's keys and the last pose
    of the reply before it."""
    out, last = [], None
    for r in replies:
        poses = key_chunk_poses(last, keys_of.get(r.event_id, set()), STEPS)
        out.append(poses)
        last = poses[-1]
    return out


def test_drive_echoes_controls_pauses_and_goes_on(server, connect, example):
    keys_of = {1: {"w"}, 2: {"w", "l"}, 3: set(), 4: {"e"}}

    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="drv", event_id=1, keys=["w"])))
            await c.send(encode(drive_request("drv", SessionStart(example.image, example.prompt, seed=3))))
            replies = [await recv_frame(c) for _ in range(2)]
            await c.send(encode(ControlRequest(session_id="drv", event_id=2, keys=["w", "l"])))
            sent_at = replies[-1].chunk_id
            while (r := await recv_frame(c)).event_id != 2:
                replies.append(r)
            replies.append(r)
            replies.append(await recv_frame(c))
            await c.send(encode(ControlRequest(session_id="drv", event_id=3, keys=[])))
            while not isinstance(reply := await c.recv(), Paused):
                assert isinstance(reply, FrameReply), reply
                await c.send(encode(AckRequest(session_id="drv", chunk_id=reply.chunk_id)))
                replies.append(reply)
            paused = reply
            await nothing_for(c, QUIET_S)  # paused: no chunk made
            await c.send(encode(ControlRequest(session_id="drv", event_id=4, keys=["e"])))
            after = [await recv_frame(c) for _ in range(2)]
            await c.send(encode(ControlRequest(session_id="drv", event_id=5, keys=[])))
            while not isinstance(last := await c.recv(), Paused):
                after.append(last)
            frames = c.videos["drv"].decode_frames()
            await reset(c, "drv")
        return replies, sent_at, paused, after, frames, last

    replies, sent_at, paused, after, frames, last = asyncio.run(go())
    ids = [r.chunk_id for r in replies + after]
    assert ids == list(range(len(ids)))
    assert paused.session_id == "drv" and paused.next_chunk_id == len(replies) == after[0].chunk_id
    # The control came while chunk sent_at + 1 ran: the chunk after it (queued, bound when the
    # DiT took it) or the one after shows it.
    first_two = next(r.chunk_id for r in replies if r.event_id == 2)
    assert sent_at + 1 <= first_two <= sent_at + 3
    events = [r.event_id for r in replies + after]
    assert events == sorted(events) and events[0] == 1 and after[0].event_id == 4
    assert last.next_chunk_id == len(ids)
    for reply, poses in zip(replies + after, expected_poses(replies + after, keys_of)):
        assert reply.poses.shape == (12, 4, 4)
        np.testing.assert_allclose(reply.poses, poses, atol=1e-5)
    assert frames.shape[0] == 9 + 12 * (len(ids) - 1)
    server.wait_held(0)


def test_the_session_never_runs_more_than_max_unacked_ahead(server, connect, example):
    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="win", event_id=1, keys=["d"])))
            await c.send(encode(drive_request("win", SessionStart(example.image, example.prompt))))
            first = [await recv_frame(c, ack=False) for _ in range(2)]  # the default window: 2
            await nothing_for(c, QUIET_S)
            await c.send(encode(AckRequest(session_id="win", chunk_id=0)))
            third = await recv_frame(c, ack=False)
            await nothing_for(c, QUIET_S)
            await c.send(encode(AckRequest(session_id="win", chunk_id=2)))
            more = [await recv_frame(c, ack=False) for _ in range(2)]
            await nothing_for(c, QUIET_S)
            await reset(c, "win")
        return first, third, more

    first, third, more = asyncio.run(go())
    assert [r.chunk_id for r in first + [third] + more] == [0, 1, 2, 3, 4]


def test_bad_controls_acks_and_infers_are_refused_and_the_session_drives_on(server, connect, example):
    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="bad", event_id=1, keys=["s"])))
            await c.send(encode(drive_request("bad", SessionStart(example.image, example.prompt))))
            before = await recv_frame(c)
            await c.send(msgpack.packb({"endpoint": "control", "session_id": "bad", "event_id": 2, "keys": ["s", "x"]}))
            await c.send(msgpack.packb({"endpoint": "control", "session_id": "bad", "event_id": -1, "keys": []}))
            await c.send(msgpack.packb({"endpoint": "ack", "session_id": "bad", "chunk_id": 99}))
            await c.send(msgpack.packb({"endpoint": "ack", "session_id": "bad", "chunk_id": "1"}))
            await c.send(encode(infer_request("bad", from_keys=True)))
            await c.send(msgpack.packb({"endpoint": "drive", "session_id": "bad", "prompt": "no image"}))
            errors, frames = [], [before]
            while len(errors) < 6:
                reply = await c.recv()
                if isinstance(reply, FrameReply):
                    await c.send(encode(AckRequest(session_id="bad", chunk_id=reply.chunk_id)))
                    frames.append(reply)
                else:
                    errors.append(reply)
            frames.append(await recv_frame(c))
            await reset(c, "bad")
        return errors, frames

    errors, frames = asyncio.run(go())
    assert all(isinstance(e, ErrorReply) for e in errors)
    assert [e.code for e in errors] == [ErrorCode.BAD_MESSAGE] * 5 + [ErrorCode.MISSING_FIELD]
    assert [r.chunk_id for r in frames] == list(range(len(frames)))  # the same session, on and on
    assert all(r.event_id == 1 for r in frames)  # the refused controls changed no key


def test_a_socket_dropped_mid_chunk_releases_the_driven_session(server, connect, example):
    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="drop", event_id=1, keys=["w"])))
            await c.send(encode(drive_request("drop", SessionStart(example.image, example.prompt))))
            await recv_frame(c)
            await asyncio.sleep(0.3)  # chunk 1 or 2 on the DiT

    asyncio.run(go())
    server.wait_held(0)


def test_a_driven_session_resumed_on_a_new_socket_waits_paused_for_keys(resume_server, resume_connect, example):
    async def go():
        async with resume_connect() as a:
            await a.send(encode(ControlRequest(session_id="res", event_id=1, keys=["w"])))
            await a.send(encode(drive_request("res", SessionStart(example.image, example.prompt))))
            old = [await recv_frame(a) for _ in range(2)]
        token = old[0].resume_token
        async with resume_connect() as b:
            await b.send(encode(ResumeRequest(session_id="res", resume_token=token, resume_from=len(old))))
            replayed = []
            while not isinstance(reply := await b.recv(), ResumeOk):
                assert isinstance(reply, FrameReply), reply
                await b.send(encode(AckRequest(session_id="res",
                                               chunk_id=reply.chunk_id)))  # the window counts from resume_from
                replayed.append(reply)
            resumed = reply
            paused = await b.recv()
            await nothing_for(b, QUIET_S)
            await b.send(encode(ControlRequest(session_id="res", event_id=2, keys=["l"])))
            new = [await recv_frame(b) for _ in range(2)]
            await b.send(encode(infer_request("res", from_keys=True)))  # still driven
            refused = await b.recv()
            while isinstance(refused, FrameReply):
                await b.send(encode(AckRequest(session_id="res", chunk_id=refused.chunk_id)))
                refused = await b.recv()
            await reset(b, "res")
        return old, replayed, resumed, paused, new, refused

    old, replayed, resumed, paused, new, refused = asyncio.run(go())
    before = old + replayed
    assert [r.chunk_id for r in before] == list(range(len(before)))
    assert resumed.next_chunk_id == len(before)
    assert isinstance(paused, Paused) and paused.next_chunk_id == resumed.next_chunk_id
    assert [r.chunk_id for r in new] == [len(before), len(before) + 1]
    assert [r.event_id for r in new] == [2, 2]
    # The camera continues from the parked session's last pose.
    np.testing.assert_allclose(new[0].poses, key_chunk_poses(before[-1].poses[-1].astype(np.float64), {"l"}, STEPS),
                               atol=1e-5)
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BAD_MESSAGE


def test_a_driven_session_is_byte_identical_to_infers_from_the_same_keys(server, connect, example):
    """A control sent as each frame arrives (where the DiT is slower than the decode, it runs
    the next chunk then, bound to the keys before it, and `controls.preempt` gives it up and
    makes it again: test_driver.py and test_dit_preempt.py pin that down; on this CPU the tiny
    DiT is usually done first). Every driven chunk, given up or not, is byte-identical to the
    chunk an infer session makes from the same keys (`from_keys`, one control before each infer)."""
    cycle = (["w"], ["l"], ["w", "j"], ["a"], ["d", "i"], ["s"])
    keys_of = {1: ["w"]} | {i + 2: cycle[(i + 1) % len(cycle)] for i in range(8)}

    async def drive():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="pre", event_id=1, keys=["w"])))
            await c.send(encode(drive_request("pre", SessionStart(example.image, example.prompt, seed=5))))
            replies = [await recv_frame(c)]
            for i in range(8):
                replies.append(await recv_frame(c))
                await c.send(encode(ControlRequest(session_id="pre", event_id=i + 2,
                                                   keys=keys_of[i + 2])))  # while the next chunk runs
            await c.send(encode(ControlRequest(session_id="pre", event_id=20, keys=[])))
            while not isinstance(reply := await c.recv(), Paused):
                assert isinstance(reply, FrameReply), reply
                await c.send(encode(AckRequest(session_id="pre", chunk_id=reply.chunk_id)))
                replies.append(reply)
            await reset(c, "pre")
        return replies

    async def replay(replies):
        async with connect() as c:
            out = []
            for r in replies:
                await c.send(encode(ControlRequest(session_id="rep", event_id=100 + r.chunk_id,
                                                   keys=keys_of.get(r.event_id, []))))
                first = SessionStart(example.image, example.prompt, seed=5, prefix_cache=False) if not out else None
                await c.send(encode(infer_request("rep", from_keys=True, start=first, client_chunk_id=r.chunk_id)))
                reply = await c.recv()
                assert isinstance(reply, FrameReply), reply
                out.append(reply)
            await c.send(encode(ResetRequest(session_id="rep")))
            assert isinstance(await c.recv(), ResetOk)
        return out

    replies = asyncio.run(drive())
    again = asyncio.run(replay(replies))
    assert [r.chunk_id for r in replies] == list(range(len(replies)))
    events = [r.event_id for r in replies]
    assert events == sorted(events)
    for r, a in zip(replies, again):
        np.testing.assert_array_equal(r.poses, a.poses)
        assert r.video == a.video, r.chunk_id
    server.wait_held(0)
