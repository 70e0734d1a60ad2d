"""Key control through the running app (PROTOCOL.md, `control`): sessions driven by the keys
held, replies that echo `event_id` and carry the poses the chunk was made with, bad controls
refused with the session intact, explicit cameras and keys mixed."""
from __future__ import annotations

import asyncio

import msgpack
import numpy as np

from camera.keys import KeySteps, key_chunk_poses
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, Forked, FrameReply, Rewound
from protocol.codec import encode
from protocol.messages import ForkRequest, RewindRequest, ControlRequest
from protocol.requests import SessionStart, infer_request

STEPS = KeySteps()  # the app runs the default `controls`


def frame(reply) -> FrameReply:
    assert isinstance(reply, FrameReply), reply
    return reply


def test_a_session_driven_by_keys_alone(server, connect, example):
    async def go():
        async with connect() as c:
            # The keys may be set before the session's first infer.
            await c.send(encode(ControlRequest(session_id="keys", event_id=1, keys=["w"])))
            await c.send(encode(infer_request("keys", start=SessionStart(example.image, example.prompt),
                                              from_keys=True, client_chunk_id=0)))
            # pipelined: read before the next infer
            await c.send(encode(ControlRequest(session_id="keys", event_id=2, keys=["W", "l"])))
            await c.send(encode(infer_request("keys", from_keys=True, client_chunk_id=1)))
            replies = [frame(await c.recv()), frame(await c.recv())]
            # An unknown key (the ControlRequest model would refuse it client-side): refused, nothing changes.
            await c.send(msgpack.packb({"endpoint": "control", "session_id": "keys", "event_id": 3, "keys": ["w", "x"]}))
            refused = await c.recv()
            await c.send(encode(infer_request("keys", from_keys=True, client_chunk_id=2)))
            replies.append(frame(await c.recv()))
            frames = c.videos["keys"].decode_frames()
            await c.reset("keys")
        return replies, refused, frames

    replies, refused, frames = asyncio.run(go())
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BAD_MESSAGE and refused.session_id == "keys"
    assert [r.chunk_id for r in replies] == [0, 1, 2]
    assert [r.event_id for r in replies] == [1, 2, 2]
    expected = [key_chunk_poses(None, {"w"}, STEPS)]
    expected.append(key_chunk_poses(expected[-1][-1], {"w", "l"}, STEPS))
    expected.append(key_chunk_poses(expected[-1][-1], {"w", "l"}, STEPS))
    for reply, poses in zip(replies, expected):
        assert reply.poses.shape == (12, 4, 4) and reply.poses.dtype == np.float32
        np.testing.assert_allclose(reply.poses, poses, atol=1e-6)
    np.testing.assert_allclose(replies[0].poses[:, 2, 3], 0.05 * np.arange(12), atol=1e-6)  # W: along +z
    assert frames.shape[0] == 9 + 12 + 12  # the session still streams after the refused control


def test_explicit_cameras_and_keys_mix(server, connect, example):
    async def go():
        async with connect() as c:
            await c.infer("mix", example, 0, first=True)  # explicit cameras, no control yet
            await c.send(encode(ControlRequest(session_id="mix", event_id=5, keys=["d", "j"])))
            await c.send(encode(infer_request("mix", from_keys=True)))
            await c.infer("mix", example, 2, first=False)  # explicit again: cameras win for their chunk
            replies = [frame(await c.recv()) for _ in range(3)]
            await c.reset("mix")
        return replies

    replies = asyncio.run(go())
    sent0, sent2 = example.chunk(0)[0], example.chunk(2)[0]
    assert [r.event_id for r in replies] == [None, 5, None]
    np.testing.assert_array_equal(replies[0].poses, sent0.astype(np.float32))
    np.testing.assert_allclose(replies[1].poses, key_chunk_poses(sent0[-1].astype(np.float64), {"d", "j"}, STEPS),
                               atol=1e-6)  # the keys continue from the explicit chunk's last pose
    np.testing.assert_array_equal(replies[2].poses, sent2.astype(np.float32))


def test_reset_releases_the_keys(server, connect, example):
    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="rk", event_id=9, keys=["w"])))
            await c.reset("rk")
            await c.send(encode(infer_request("rk", start=SessionStart(example.image, example.prompt), from_keys=True)))
            reply = frame(await c.recv())
            await c.reset("rk")
        return reply

    reply = asyncio.run(go())
    assert reply.event_id is None  # no key state since the reset: a still camera
    np.testing.assert_array_equal(reply.poses, np.broadcast_to(np.eye(4, dtype=np.float32), (12, 4, 4)))


def test_keys_after_a_rewind_or_fork_continue_from_the_kept_chunk(server, connect, example):
    """Rewind to 1 after three key-driven chunks: the next key-driven chunk continues from chunk
    0's last pose (not chunk 2's), as does a fork at 1; event ids follow the controls."""

    async def go():
        async with connect() as c:
            await c.send(encode(ControlRequest(session_id="rw", event_id=1, keys=["w"])))
            await c.send(encode(infer_request("rw", start=SessionStart(example.image, example.prompt), from_keys=True)))
            first = [frame(await c.recv())]
            await c.send(encode(ControlRequest(session_id="rw", event_id=2, keys=["l"])))
            for _ in range(2):
                await c.send(encode(infer_request("rw", from_keys=True)))
                first.append(frame(await c.recv()))
            await c.send(encode(RewindRequest(session_id="rw", to_chunk=1)))
            rewound = await c.recv()
            await c.send(encode(ControlRequest(session_id="rw", event_id=3, keys=["a"])))
            await c.send(encode(infer_request("rw", from_keys=True)))
            again = frame(await c.recv())
            await c.send(encode(ForkRequest(session_id="rw", new_session_id="rw-b", at_chunk=1)))
            forked = await c.recv()
            await c.send(encode(ControlRequest(session_id="rw-b", event_id=4, keys=["d"])))
            await c.send(encode(infer_request("rw-b", from_keys=True)))
            branch = frame(await c.recv())
            await c.reset("rw-b")
            await c.reset("rw")
        return first, rewound, again, forked, branch

    first, rewound, again, forked, branch = asyncio.run(go())
    assert isinstance(rewound, Rewound) and rewound.next_chunk_id == 1, rewound
    assert isinstance(forked, Forked) and forked.next_chunk_id == 1, forked
    start = first[0].poses[-1].astype(np.float64)
    assert not np.allclose(first[2].poses[-1], start, atol=1e-3)  # chunk 2 moved on: the old bug would show
    assert (again.chunk_id, again.event_id) == (1, 3)
    np.testing.assert_allclose(again.poses, key_chunk_poses(start, {"a"}, STEPS), atol=1e-6)
    assert (branch.chunk_id, branch.event_id) == (1, 4)
    np.testing.assert_allclose(branch.poses, key_chunk_poses(start, {"d"}, STEPS), atol=1e-6)


def _stream(session_id: str, next_chunk: int) -> "Stream":
    from deployments.ingress.journal import SessionJournal
    from deployments.ingress.stream import Stream
    from deployments.wire import SessionOptions

    journal = SessionJournal(np.zeros((8, 8, 3), np.uint8), 1 << 30)
    journal._keep(2 << 30)  # dropped over its budget (sessions.journal_max_mib): no pose to read back
    spec = SessionOptions(session_id, "p", "d", (16, 16), 1, None, None, (480, 832), False)
    return Stream(spec, journal, journal.image, next_chunk=next_chunk)


def test_a_fork_at_the_head_continues_the_sources_camera_without_a_journal():
    """A session whose journal was dropped forks at its head by copy (history/branching.py): the
    fork's next key-driven chunk continues from the source's last pose, not from the identity;
    a fork below the head takes nothing from the cursor (its journal's pose, where it has one)."""
    from deployments.config import ControlArgs
    from deployments.ingress.controls import ControlBook

    book = ControlBook(ControlArgs())
    book.set(ControlRequest(session_id="src", event_id=1, keys=["w", "l"]))
    source = _stream("src", 0)
    for k in range(2):  # two key-driven chunks accepted: the camera moved on
        cams = book.keyed(source, k)
        book.commit(source, cams, k)
        source.next_chunk = k + 1
    head = cams.last_pose
    assert not np.allclose(head, np.eye(4), atol=1e-3)
    fork = _stream("fork", 2)
    book.forked(fork, source, 2)
    book.set(ControlRequest(session_id="fork", event_id=2, keys=["d"]))
    np.testing.assert_allclose(book.keyed(fork, 2).poses, key_chunk_poses(head, {"d"}, STEPS), atol=1e-6)
    below = _stream("below", 1)
    book.forked(below, source, 1)  # not the source's head: its cursor does not apply
    book.set(ControlRequest(session_id="below", event_id=3, keys=["d"]))
    np.testing.assert_allclose(book.keyed(below, 1).poses, key_chunk_poses(None, {"d"}, STEPS), atol=1e-6)


def test_keys_continue_from_the_float32_pose_so_a_rewound_stream_gets_the_same_poses_to_the_bit():
    """A stream continuing with its cursor and one continuing from its journal (a rewind, a fork
    below the head, a resume) get the same poses, bit for bit: the cursor keeps the float32 pose
    the chunk was sent and journaled with, not the float64 one it was rounded from (which made a
    rewound chunk's poses differ by an ulp, its latents by ~5e-7 and its H.264 bytes)."""
    from deployments.config import ControlArgs
    from deployments.ingress.controls import ControlBook
    from deployments.wire import NoiseSnapshot

    noise = NoiseSnapshot(np.zeros(2, np.uint8), False)
    for first, second in [(["w"], ["w", "j"]), (["w", "l"], ["d", "i"]), (["q", "a"], ["w", "l", "i"])]:
        book = ControlBook(ControlArgs())
        live, rewound = _stream("live", 0), _stream("rewound", 1)
        rewound.journal = type(live.journal)(np.zeros((8, 8, 3), np.uint8), 1 << 30)  # one that keeps chunks
        book.set(ControlRequest(session_id="live", event_id=1, keys=first))
        cams = book.keyed(live, 0)
        book.commit(live, cams, 0)
        live.next_chunk = 1
        assert cams.poses.dtype == np.float32
        rewound.journal.add_chunk(cams.poses, cams.intrinsics, np.zeros(1, np.float32), np.zeros(1, np.float32), noise)
        book.set(ControlRequest(session_id="live", event_id=2, keys=second))
        again = book.keyed(live, 1).poses  # from the cursor
        book.set(ControlRequest(session_id="rewound", event_id=3, keys=second))
        np.testing.assert_array_equal(book.keyed(rewound, 1).poses, again)  # from the journal
