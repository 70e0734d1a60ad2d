"""Sessions kept in an S3 world store through the real app (issue 55 items 2 and 3, the S3 side of
test_worlds_restart.py): SeaweedFS (tests/seaweed.py) started for this module, the app's
`worlds.backend: s3` pointing at it, its replicas holding the test server's (any) keys from the
environment (tests/deployments/conftest.py sets them before Ray starts). A session saved, listed,
exported, imported, opened, and resumed with its token after the app was deleted and run again
(its unacknowledged chunk sent again from the store); the SeaweedFS process stopped mid-session:
the stream goes on, `/healthz` says degraded, one `store_behind` notice, and every chunk is in
the store once it is back."""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import httpx
import pytest
from ray import serve

from deployments.ingress.parking import token_digest
from deployments.ingress.worlds.keeping import world_of_token
from deployments.worlds.errors import StoreUnavailable, WorldNotFound
from deployments.worlds.s3 import S3WorldStore
from deployments.worlds.worlds import Worlds
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import FrameReply, Opened, OpenRequest, Saved, SaveRequest
from seaweed import BUCKET, SeaweedServer
from session_holders import reference_videos

APP = "worlds-s3"
CHUNKS = 5
LONG_FRAMES = 57  # 5 chunks
PRINCIPAL = "addr:127.0.0.1"  # no auth: the client's address
KEYS = {"access_key_env": "LWF_TEST_S3_KEY", "secret_key_env": "LWF_TEST_S3_SECRET"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_app(extra_app, s3):
    """(run, worlds): `run()` deploys the app on the S3 store (again: the same args); `worlds`
    reads the same bucket and prefix from this process. The app is deleted after the module."""
    prefix = f"serve{uuid.uuid4().hex[:10]}"
    overrides = {"worlds": {"enabled": True, "backend": "s3", "endpoint": s3.endpoint, "bucket": BUCKET,
                            "prefix": prefix, "timeout_s": 2.0, **KEYS},
                 "sessions": {"max_sessions": 8, "resume": {"grace_s": 30.0}}, "dit": {"num_replicas": 1}}
    worlds = Worlds(S3WorldStore(BUCKET, endpoint=s3.endpoint, prefix=prefix, timeout_s=5.0, **KEYS))
    try:
        yield (lambda: extra_app(APP, **overrides)), worlds
    finally:
        serve.delete(APP)


def stored(worlds: Worlds, token: str) -> int:
    try:
        return worlds.manifest(PRINCIPAL, world_of_token(token_digest(token))).chunks
    except (WorldNotFound, StoreUnavailable):
        return 0


def wait_stored(worlds: Worlds, token: str, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (have := stored(worlds, token)) != n:
        assert time.monotonic() < deadline, f"the store has {have} chunks, expected {n}"
        time.sleep(0.2)


def test_on_s3_a_session_is_saved_exported_imported_opened_and_resumed_after_a_restart(s3_app, example):
    run, worlds = s3_app
    app, connect = run()
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)

    async def first() -> tuple[list[bytes], list[FrameReply], Saved]:
        reference = await reference_videos(connect, "ref-s3", traj, CHUNKS, 41)
        async with connect() as c:  # left without a reset: the app goes before it is claimed
            for k in range(3):
                await c.infer("walk", traj, k, first=k == 0, seed=41)
            got = [await c.recv() for _ in range(3)]
            await c.send(encode(SaveRequest(session_id="walk", title="on s3")))
            saved = await c.recv()
        return reference, got, saved

    reference, got, saved = asyncio.run(first())
    assert [r.video for r in got] == reference[:3]
    assert isinstance(saved, Saved) and saved.chunks == 3, saved
    token = got[0].resume_token
    wait_stored(worlds, token, 3)
    http = f"{app.http}/v1/worlds"
    listed = {w["id"]: w for w in httpx.get(http, timeout=30).json()["data"]}
    assert listed[saved.world_id]["title"] == "on s3" and listed[world_of_token(token_digest(token))]["chunks"] == 3
    lwf = httpx.get(f"{http}/{saved.world_id}/export", timeout=60)
    assert lwf.status_code == 200 and lwf.content[:8] == b"LWFWORLD"
    imported = httpx.post(f"{http}/import", content=lwf.content,
                          headers={"Content-Type": "application/octet-stream"}, timeout=60)
    assert imported.status_code == 201, imported.text
    copy = imported.json()["id"]
    assert httpx.get(f"{http}/{copy}/video", timeout=60).content == b"".join(reference[:3])

    serve.delete(APP)  # serve shutdown ... serve run: the new app's parking knows no session
    app, connect = run()

    async def after() -> tuple[FrameReply, FrameReply, Opened, FrameReply]:
        async with connect() as c:  # its client acknowledged chunks 0 and 1 only
            await c.infer("walk", traj, 3, first=False, resume_token=token, resume_from=2)
            again, third = await c.recv(), await c.recv()
            await c.reset("walk")
        async with connect() as d:
            await d.send(encode(OpenRequest(session_id="copy", world_id=copy)))
            opened = await d.recv()
            await d.infer("copy", traj, 3, first=False)
            from_copy = await d.recv()
            await d.reset("copy")
        return again, third, opened, from_copy

    again, third, opened, from_copy = asyncio.run(after())
    assert isinstance(again, FrameReply) and again.chunk_id == 2 and again.video == reference[2], again
    assert isinstance(third, FrameReply) and third.chunk_id == 3 and third.video == reference[3], third
    assert isinstance(opened, Opened) and opened.next_chunk_id == 3, opened
    assert isinstance(from_copy, FrameReply) and from_copy.video == reference[3]  # byte-identical
    wait_stored(worlds, token, 4)
    assert [c.video for c in worlds.load(PRINCIPAL, world_of_token(token_digest(token))).chunks] == reference[:4]


def test_on_s3_the_store_stopped_mid_session_degrades_and_catches_up(s3_app, example, s3):
    run, worlds = s3_app
    app, connect = run()
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)

    def health() -> dict:
        return httpx.get(f"{app.http}/healthz", timeout=30).json()

    async def go() -> tuple[list[FrameReply], list, dict, str]:
        async with connect() as c:
            await c.infer("lake", traj, 0, first=True, seed=5)
            replies = [await c.recv()]
            token = replies[0].resume_token
            await asyncio.to_thread(wait_stored, worlds, token, 1)
            await asyncio.to_thread(s3.stop)  # the SeaweedFS process ends
            try:
                await c.infer("lake", traj, 1, first=False)
                replies.append(await c.recv())  # the stream goes on
                while not (during := await asyncio.to_thread(health))["worlds"]["degraded"]:
                    await asyncio.sleep(0.2)
                await c.infer("lake", traj, 2, first=False)
                replies.append(await c.recv())
            finally:
                await asyncio.to_thread(s3.start)
            for k in (3, 4):
                await c.infer("lake", traj, k, first=False)
                replies.append(await c.recv())
            await asyncio.to_thread(wait_stored, worlds, token, CHUNKS)
            await c.reset("lake")
            return replies, c.notices, during, token

    replies, notices, during, token = asyncio.run(go())
    assert [r.chunk_id for r in replies] == list(range(CHUNKS))
    assert during["status"] == "degraded" and during["worlds"]["backend"] == "s3" and during["worlds"]["queued"] >= 1
    assert [n.code for n in notices] == [ErrorCode.STORE_BEHIND]  # once for the outage
    world = worlds.load(PRINCIPAL, world_of_token(token_digest(token)))
    assert [c.video for c in world.chunks] == [r.video for r in replies]  # nothing lost
    deadline = time.monotonic() + 30
    while (status := health()["status"]) != "ok":
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
