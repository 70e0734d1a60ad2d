"""Resume after a dropped connection, through the real app (/resume: two ingress replicas, one
DiT replica, sessions parked for RESUME_GRACE_S): the video goes on byte for byte, missed
replies come again exactly once, tokens are checked, the grace period frees everything."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import time


from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, ResumeOk
from protocol.codec import encode
from session_holders import reference_videos
from protocol.messages import ResumeRequest

LONG_FRAMES = 57  # 5 chunks




async def _on_other_ingress(connect, replica: str, tries: int = 40):
    """A connection (entered) whose ingress replica is not `replica` (the proxy picks one)."""
    for _ in range(tries):
        conn = connect()
        c = await conn.__aenter__()
        if c.config.debug["ingress_replica"] != replica:
            return conn, c
        await conn.__aexit__(None, None, None)
    raise AssertionError(f"{tries} connections all reached ingress replica {replica}")


def test_resume_on_the_other_ingress_replica_continues_byte_for_byte(resume_server, resume_connect, example,
                                                                       resume_grace_s):
    """Close the socket after chunk 1 of 3; a new socket through the other ingress replica
    resumes with the token: the concatenated video equals the uninterrupted session's, and the
    DiT replica's state was used as it was (no rebuild)."""
    async def go():
        reference = await reference_videos(resume_connect, "ref", example, 3, seed=5)
        async with resume_connect() as a:
            assert a.config.resume_grace_s == resume_grace_s
            for k in range(2):
                await a.infer("walk", example, k, first=k == 0, seed=5)
            first = [await a.recv(), await a.recv()]
            replica = a.config.debug["ingress_replica"]
        token = first[0].resume_token
        conn, b = await _on_other_ingress(resume_connect, replica)
        try:
            await b.infer("walk", example, 2, first=False, resume_token=token, resume_from=2)
            last = await b.recv()
            await b.reset("walk")
        finally:
            await conn.__aexit__(None, None, None)
        return reference, first, last, token

    resume_server.wait_held(0)
    reference, first, last, token = asyncio.run(go())
    assert isinstance(token, str) and len(token) >= 32 and first[1].resume_token is None
    assert isinstance(last, FrameReply), last
    assert [r.chunk_id for r in first] + [last.chunk_id] == [0, 1, 2]
    assert [r.video for r in first] + [last.video] == reference
    assert last.debug["recoveries"] == 0  # the parked session's replica state, not a replay
    resume_server.wait_held(0)


def test_chunks_in_flight_at_the_drop_come_once_on_the_new_socket(resume_server, resume_connect, example):
    """Three chunks sent at once, the socket closed after the first reply: `resume` with
    resume_from=1 brings chunks 1 and 2 (none lost, none twice), then `resumed`."""
    async def go():
        reference = await reference_videos(resume_connect, "ref2", example, 3, seed=6)
        async with resume_connect() as a:
            for k in range(3):
                await a.infer("flight", example, k, first=k == 0, seed=6)
            first = await a.recv()
        async with resume_connect() as b:
            await b.send(encode(ResumeRequest(session_id="flight", resume_token=first.resume_token, resume_from=1)))
            replies = [await b.recv() for _ in range(3)]
            await b.reset("flight")
        return reference, first, replies

    resume_server.wait_held(0)
    reference, first, replies = asyncio.run(go())
    *frames, done = replies
    assert all(isinstance(r, FrameReply) for r in frames), replies
    assert isinstance(done, ResumeOk) and done.next_chunk_id == 3 and done.replayed == 2, done
    assert [first.chunk_id] + [r.chunk_id for r in frames] == [0, 1, 2]
    assert [first.video] + [r.video for r in frames] == reference
    resume_server.wait_held(0)


def test_a_wrong_or_missing_token_is_refused_and_the_session_stays(resume_server, resume_connect, example):
    async def go():
        async with resume_connect() as a:
            await a.infer("mine", example, 0, first=True)
            first = await a.recv()
        async with resume_connect() as b:
            await b.send(encode(ResumeRequest(session_id="mine", resume_token="x" * 43)))
            wrong = await b.recv()
            await b.infer("mine", example, 1, first=False)  # no token, no image
            missing = await b.recv()
            await b.send(encode(ResumeRequest(session_id="mine", resume_token=first.resume_token)))
            right = await b.recv()
            await b.reset("mine")
        return wrong, missing, right

    resume_server.wait_held(0)
    wrong, missing, right = asyncio.run(go())
    assert isinstance(wrong, ErrorReply) and wrong.code is ErrorCode.UNAUTHORIZED, wrong
    assert isinstance(missing, ErrorReply) and missing.code is ErrorCode.UNAUTHORIZED, missing
    assert "resume_token" in missing.message
    assert isinstance(right, ResumeOk) and right.next_chunk_id == 1 and right.replayed == 0, right
    resume_server.wait_held(0)


def test_the_grace_period_frees_the_replicas_and_a_late_resume_is_told_so(resume_server, resume_connect, example,
                                                                          resume_grace_s):
    """A parked session holds its replica state for the grace period only (here well before
    the replicas' idle TTL); a resume after it gets session_lost saying the grace period ended."""
    async def park() -> str:
        async with resume_connect() as a:
            await a.infer("late", example, 0, first=True)
            return (await a.recv()).resume_token

    async def late(token: str):
        async with resume_connect() as b:
            await b.send(encode(ResumeRequest(session_id="late", resume_token=token)))
            return await b.recv()

    resume_server.wait_held(0)
    t0 = time.monotonic()
    token = asyncio.run(park())
    time.sleep(0.5)
    assert resume_server.held() == {"vae": 1, "dit": 1}  # parked: still held
    resume_server.wait_held(0, timeout=resume_grace_s + 4.0)
    freed = time.monotonic() - t0
    assert freed < 10.0, freed  # the idle TTL (10 s) did not do it
    reply = asyncio.run(late(token))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.SESSION_LOST, reply
    assert "grace period" in reply.message
    print(f"RELIABILITY resume-grace: grace={resume_grace_s:g}s freed_after={freed:.1f}s")


def test_soak_random_drops_and_resumes_keep_every_video_exact(resume_server, resume_connect, example, resume_grace_s):
    """Two sessions at once, each of 5 chunks, dropped at random moments (closed or aborted,
    with chunks in flight or not) and resumed with what the client has: each video equals its
    uninterrupted run."""
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
    rng = random.Random(1234)

    async def dropping(sid: str, seed: int, drops: list) -> list[bytes]:
        videos: dict[int, bytes] = {}
        token, sent = None, 0
        while len(videos) < 5:
            async with resume_connect() as c:
                if token is not None:
                    await c.send(encode(ResumeRequest(session_id=sid, resume_token=token, resume_from=len(videos))))
                    while not isinstance(reply := await c.recv(), ResumeOk):
                        assert isinstance(reply, FrameReply) and reply.chunk_id not in videos, reply
                        videos[reply.chunk_id] = reply.video
                    sent = reply.next_chunk_id
                ahead = rng.randint(1, 3)
                while len(videos) < 5:
                    while sent < 5 and sent - len(videos) < ahead:
                        await c.infer(sid, traj, sent, first=sent == 0, seed=seed)
                        sent += 1
                    reply = await c.recv()
                    assert isinstance(reply, FrameReply) and reply.chunk_id not in videos, reply
                    videos[reply.chunk_id] = reply.video
                    token = token or reply.resume_token
                    if len(videos) < 5 and rng.random() < 0.5:
                        drops.append(sid)
                        if rng.random() < 0.5:
                            c.ws.transport.abort()  # no close handshake
                        break
                else:
                    await c.reset(sid)
        return [videos[k] for k in range(5)]

    async def go():
        references = [await reference_videos(resume_connect, f"soak-ref{i}", traj, 5, seed=20 + i) for i in range(2)]
        drops: list = []
        videos = await asyncio.gather(*(dropping(f"soak{i}", 20 + i, drops) for i in range(2)))
        return references, videos, drops

    resume_server.wait_held(0)
    references, videos, drops = asyncio.run(go())
    assert videos == references
    assert drops, "the soak dropped no socket"
    print(f"RELIABILITY resume-soak: sessions=2 chunks=10 drops={len(drops)} lost=0 duplicated=0")
    resume_server.wait_held(0, timeout=resume_grace_s + 6.0)


def test_the_resume_drill_benchmark_runs_against_the_server(resume_server, resume_grace_s):
    """benchmarks/resume_drill.py (run on the H200 by gpu_serve.sh) against the CPU app: the
    chunk in flight at the drop is replayed and the resumed video equals the reference."""
    from benchmarks.resume_drill import main

    resume_server.wait_held(0)
    result = main(["--url", resume_server.ws, "--frames", "33", "--drop-after", "0", "--out", "/dev/null"])
    assert set(result) >= {"store_off", "store_on"} and result["all_identical"], result
    for run in (result["store_off"], result["store_on"]):
        assert run["chunks"] == 3 and run["resume_grace_s"] == resume_grace_s
        assert run["replayed"] == run["in_flight_at_drop"] == 1
        assert run["all_identical"] and run["identical_chunks"] == 3, run
    resume_server.wait_held(0)


def test_the_python_client_resumes_a_dropped_socket_by_itself(resume_server, example):
    """WorldClient + stream_session with a ResumePolicy (what `lwf-client` does): the socket is
    closed under it after chunk 1 with chunk 2 in flight; it reconnects, resumes and finishes.
    The MP4 equals an uninterrupted session's byte for byte."""
    from client.session import WorldClient
    from client.streaming import ResumePolicy
    from client.trajectory import Trajectory, plan_session

    traj = Trajectory(image=example.image, prompt=example.prompt, poses=example.poses, intrinsics=example.intrinsics)
    plan = plan_session(traj, LONG_FRAMES)

    async def play(sid: str, drop_after: int | None):
        client = await WorldClient.connect(resume_server.ws)
        assert client.config.resume_grace_s
        dropped = []

        def on_chunk(stat, reply) -> None:
            if stat.index == drop_after and not dropped:
                dropped.append(asyncio.ensure_future(client._ws.close()))  # the socket ends under the stream

        try:
            result = await client.stream(traj.messages(plan, sid, seed=9), pipeline=2, on_chunk=on_chunk,
                                         resume=ResumePolicy(sid, backoff_s=0.2))
            await client.reset(sid)
        finally:
            await client.close()
        return result

    async def go():
        return await play("whole", None), await play("dropped", 1)

    resume_server.wait_held(0)
    whole, dropped = asyncio.run(go())
    assert whole.resumes == 0 and dropped.resumes == 1 and dropped.replayed >= 1
    assert [s.index for s in dropped.stats] == list(range(plan.num_chunks))
    assert dropped.video.data == whole.video.data
    resume_server.wait_held(0)
