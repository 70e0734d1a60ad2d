"""The WebSocket protocol through the running app (sessions, resets, errors, pipelining, expiry),
and the lanes of one Connection against recording fake deployments."""
from __future__ import annotations

import asyncio

import msgpack

from deployments.config import AppArgs
from deployments.ingress.connection import Backends, Connection
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from connection_fakes import FakeDeployment, FakeMetrics, FakeSocket

STAGES = {"text_encode", "vae_encode", "dit", "vae_decode", "mux", "queue_wait", "total"}
OUTPUT_HW = (32, 48)  # 16:9 image at size 32*64: lat 4x6 (spec B.1 worked by hand)


def error(reply, code: ErrorCode) -> ErrorReply:
    assert isinstance(reply, ErrorReply), f"expected error {code.value}, got {reply!r}"
    assert reply.code is code, reply
    return reply


def test_three_chunk_session_is_one_playable_mp4(server, connect, example):
    async def go():
        async with connect() as c:
            replies = await c.run_session("three", example)
            frames = c.videos["three"].decode_frames()
            await c.reset("three")
        return replies, frames

    replies, frames = asyncio.run(go())
    assert [r.chunk_id for r in replies] == [0, 1, 2]
    assert [r.client_chunk_id for r in replies] == [0, 1, 2]
    assert [r.num_frames for r in replies] == [9, 12, 12]
    assert all(r.resolution == OUTPUT_HW and r.fps == 16 and not r.reset for r in replies)
    assert replies[0].video[4:8] == b"ftyp" and all(r.video[4:8] == b"moof" for r in replies[1:])
    assert replies[0].mime_type.startswith('video/mp4; codecs="avc1.')
    for r in replies:
        assert set(r.stage_durations) == STAGES
        d = r.stage_durations
        assert all(v >= 0 for v in d.values())
        assert d["total"] >= d["dit"] + d["vae_decode"] + d["mux"]
    assert replies[0].stage_durations["text_encode"] > 0 and replies[1].stage_durations["text_encode"] == 0
    assert frames.shape == (9 + 12 + 12, *OUTPUT_HW, 3)
    # One DiT replica and one VAE replica served every chunk of the session.
    assert len({r.debug["dit_replica"] for r in replies}) == 1
    assert len({r.debug["vae_replica"] for r in replies}) == 1


def test_reset_drops_the_session_and_a_new_one_starts_at_chunk_zero(server, connect, example):
    async def go():
        async with connect() as c:
            await c.infer("r", example, 0, first=True)
            assert isinstance(await c.recv(), FrameReply)
            ok = await c.reset("r")
            # The session is gone: continuing it without image/prompt is a missing_field.
            await c.infer("r", example, 1, first=False)
            missing = await c.recv()
            await c.infer("r", example, 0, first=True)
            again = await c.recv()
            await c.reset("r")
            await c.reset("never-opened")  # resetting an unknown session is harmless
        return ok, missing, again

    ok, missing, again = asyncio.run(go())
    assert ok.session_id == "r"
    error(missing, ErrorCode.MISSING_FIELD)
    assert isinstance(again, FrameReply) and again.chunk_id == 0 and again.num_frames == 9
    assert again.video[4:8] == b"ftyp"
    server.wait_held(0)


def test_new_session_id_releases_the_previous_session(server, connect, example):
    async def go():
        async with connect() as c:
            await c.infer("a", example, 0, first=True)
            a0 = await c.recv()
            await c.infer("b", example, 0, first=True)
            b0 = await c.recv()
            server.wait_held(1)  # a was released, b is held
            await c.infer("a", example, 1, first=False)
            a1 = await c.recv()
            await c.infer("b", example, 1, first=False)
            b1 = await c.recv()
            await c.reset("b")
        return a0, b0, a1, b1

    a0, b0, a1, b1 = asyncio.run(go())
    assert isinstance(a0, FrameReply) and isinstance(b0, FrameReply)
    assert b0.chunk_id == 0 and not b0.reset
    error(a1, ErrorCode.MISSING_FIELD)
    assert isinstance(b1, FrameReply) and b1.chunk_id == 1
    # Same inputs and seed: session b reproduced session a's first chunk exactly.
    assert a0.video == b0.video


def test_prompt_change_resets_the_session_implicitly(server, connect, example):
    async def go():
        async with connect() as c:
            await c.infer("p", example, 0, first=True)
            first = await c.recv()
            await c.infer("p", example, 1, first=False)
            await c.recv()
            await c.infer("p", example, 0, first=True, prompt="a different prompt")
            changed = await c.recv()
            await c.reset("p")
        async with connect() as c:
            await c.infer("fresh", example, 0, first=True, prompt="a different prompt")
            fresh = await c.recv()
            await c.reset("fresh")
        return first, changed, fresh

    first, changed, fresh = asyncio.run(go())
    assert not first.reset
    assert isinstance(changed, FrameReply) and changed.reset and changed.chunk_id == 0
    assert changed.num_frames == 9 and changed.video[4:8] == b"ftyp"
    # The reset session is exactly a fresh session with the new prompt.
    assert changed.video == fresh.video != first.video


def test_malformed_frames_get_errors_and_the_connection_stays_usable(connect, example):
    poses, intrinsics = example.chunk(0)
    bent = poses.copy()
    bent[0, :3, :3] *= 1.5  # not a rotation

    async def go():
        async with connect() as c:
            replies = []
            await c.send(b"\xc1 not msgpack")
            replies.append(await c.recv())
            await c.ws.send("a text frame")
            replies.append(await c.recv())
            await c.send(msgpack.packb({"endpoint": "teleport", "session_id": "m"}))
            replies.append(await c.recv())
            await c.send(msgpack.packb({"endpoint": "infer", "session_id": "m"}))
            replies.append(await c.recv())
            cameras = {"poses": poses.tolist(), "intrinsics": intrinsics.tolist()}
            bad_cameras = {"poses": bent.tolist(), "intrinsics": intrinsics.tolist()}
            await c.send(msgpack.packb({"session_id": "m", "image": example.image, "prompt": "x",
                                        "cameras": bad_cameras}))
            replies.append(await c.recv())
            await c.send(msgpack.packb({"session_id": "m", "image": b"\x89PNG but not really", "prompt": "x",
                                        "cameras": cameras}))
            replies.append(await c.recv())
            await c.send(encode(infer_request("m", poses, intrinsics, prompt="no image")))
            replies.append(await c.recv())
            await c.infer("m", example, 0, first=True)
            replies.append(await c.recv())
            await c.reset("m")
        return replies

    replies = asyncio.run(go())
    codes = [ErrorCode.BAD_MESSAGE, ErrorCode.BAD_MESSAGE, ErrorCode.BAD_MESSAGE, ErrorCode.MISSING_FIELD,
             ErrorCode.BAD_CAMERAS, ErrorCode.BAD_IMAGE, ErrorCode.MISSING_FIELD]
    for reply, code in zip(replies, codes):
        assert error(reply, code).message
    assert isinstance(replies[-1], FrameReply) and replies[-1].chunk_id == 0


def test_pipelined_infers_beyond_the_limit_get_busy_and_replies_stay_in_order(connect, example):
    async def go():
        async with connect() as c:
            for k in range(5):  # max_pending_chunks is 4; no num_frames: the session is open-ended
                poses, intrinsics = example.chunk(min(k, 2))
                extra = SessionStart(example.image, example.prompt) if k == 0 else None
                await c.send(encode(infer_request("pipe", poses, intrinsics, start=extra, client_chunk_id=k)))
            replies = [await c.recv() for _ in range(5)]
            await c.reset("pipe")
        return replies

    replies = asyncio.run(go())
    frames = [r for r in replies if isinstance(r, FrameReply)]
    assert [r.client_chunk_id for r in frames] == [0, 1, 2, 3]
    assert [r.chunk_id for r in frames] == [0, 1, 2, 3]
    busy = error(replies[-1], ErrorCode.BUSY)
    assert busy.retry_after_s > 0


def test_chunks_beyond_the_declared_length_are_refused(connect, example):
    async def go():
        async with connect() as c:
            replies = await c.run_session("len", example)
            await c.infer("len", example, 2, first=False)
            over = await c.recv()
            await c.reset("len")
        return replies, over

    replies, over = asyncio.run(go())
    assert len(replies) == 3
    refused = error(over, ErrorCode.SESSION_LIMIT)  # a limit reached, not a size (issue 57)
    assert refused.chunks_left == 0 and not refused.is_notice and refused.session_id == "len"
    assert refused.message == ("this session declared num_frames for 3 chunks and all were sent; "
                               "reset to start a new session")


def test_a_session_expired_while_idle_is_rebuilt_and_continues_exactly(server, connect, example):
    """The replicas drop a session idle beyond their TTL; its next chunk rebuilds it from the
    connection's journal (DiT and VAE) and the video continues as if nothing happened."""
    ttl = server.sessions()["idle_ttl_s"]

    async def go():
        async with connect() as c:
            reference = await c.run_session("busy", example)
            await c.reset("busy")
            await c.infer("idle", example, 0, first=True)
            first = await c.recv()
            server.wait_held(1)
            await asyncio.sleep(ttl + ttl / 4 + 2.0)  # TTL + one sweep period + slack
            dropped = server.held()
            await c.infer("idle", example, 1, first=False)
            await c.infer("idle", example, 2, first=False)
            rest = [await c.recv(), await c.recv()]
            await c.reset("idle")
        return reference, [first, *rest], dropped

    reference, replies, dropped = asyncio.run(go())
    assert dropped == {"vae": 0, "dit": 0}
    assert all(isinstance(r, FrameReply) for r in replies), replies
    assert [r.chunk_id for r in replies] == [0, 1, 2]
    assert [r.debug["recoveries"] for r in replies] == [0, 2, 2]  # DiT and VAE rebuilt once each
    assert [r.video for r in replies] == [r.video for r in reference]
    server.wait_held(0)


def test_a_client_leaving_mid_stream_frees_its_session_at_once(server, connect, example):
    ttl = server.sessions()["idle_ttl_s"]

    async def go():
        async with connect() as c:
            for k in range(3):
                await c.infer("gone", example, k, first=k == 0)
            first = await c.recv()
        return first  # the socket closes with two chunks still in flight

    assert isinstance(asyncio.run(go()), FrameReply)
    server.wait_held(0, timeout=ttl / 2)  # released by the connection's cleanup, not by the idle TTL


# ---- the lanes of one Connection, against recording fake deployments (no Ray) ----

def test_lanes_overlap_dit_and_vae_and_keep_one_call_in_flight_per_deployment(example):
    log: list[str] = []
    backends = Backends(text=FakeDeployment("text", log, 0.01), vae=FakeDeployment("vae", log, 0.05),
                        dit=FakeDeployment("dit", log, 0.05))
    frames = []
    for k in range(3):
        poses, intrinsics = example.chunk(k)
        extra = SessionStart(example.image, "p", num_frames=33) if k == 0 else None
        frames.append(encode(infer_request("s", poses, intrinsics, start=extra, client_chunk_id=k)))
    ws = FakeSocket(frames)
    args = AppArgs()

    async def go():
        conn = Connection(ws, backends, args, Limits(), CameraServerConfig(model="tiny"), FakeMetrics())
        await asyncio.wait_for(conn.run(), 30)

    asyncio.run(go())
    calls = {name: [e.split(" ")[0].split(".")[1] for e in log if e.startswith(f"{name}.") and e.endswith("start")]
             for name in ("text", "vae", "dit")}
    # All three infers arrived at once: the conditionings were queued before the first decode.
    assert calls["vae"] == ["open"] + ["condition"] * 3 + ["decode"] * 3 + ["close"]  # close: the client left
    # The DiT reserves the session's room before any work (admission first), then opens it.
    assert calls["dit"] == ["reserve", "open"] + ["step"] * 3 + ["close"] and calls["text"] == ["encode"]
    # The DiT started chunk 1 before the VAE had decoded chunk 0.
    assert log.index("dit.step start", log.index("dit.step end") + 1) < log.index("vae.decode end")
    replies = ws.sent[1:]
    assert [r.chunk_id for r in replies] == [0, 1, 2] and [r.client_chunk_id for r in replies] == [0, 1, 2]


def test_connection_owns_its_parts_instead_of_inheriting_them():
    """Issue 32: lanes, replies, outbox, releases and resume book are objects a Connection
    holds, each with its own state; no mixin bases that reach into each other's attributes."""
    assert Connection.__bases__ == (object,)
