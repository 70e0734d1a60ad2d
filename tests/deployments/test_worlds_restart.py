"""Sessions kept in the world store (issue 55 items 2 and 3), through the real app with the
store on (a local folder): a store that fails mid-session (its folder made a symlink loop: every
call fails) leaves the stream going, `/healthz` degraded and one `store_behind` notice, and
loses nothing once it is back; three live sessions resume with their tokens and continue
byte-identical after the app is deleted and run again (`serve shutdown` + `serve run`), after a
deploy that changes `sessions.max_sessions` (every replica and the parking replaced) and after
their ingress replica is killed mid-session; each chunk a client received is in the store."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Optional

import httpx
import pytest
from ray import serve

from deployments.ingress.parking import token_digest
from deployments.ingress.worlds.keeping import world_of_token
from deployments.worlds.errors import WorldNotFound
from deployments.worlds.local import LocalStore
from deployments.worlds.worlds import Worlds
from protocol.errors import ErrorCode
from protocol.codec import encode
from session_holders import reference_videos
from protocol.messages import ErrorReply, FrameReply, Opened, OpenRequest, Saved, SaveRequest
from support import wait_healthy

APP = "worlds"
CHUNKS = 5
LONG_FRAMES = 57  # 5 chunks
SEEDS = {"a": 11, "b": 12, "c": 13}
PRINCIPAL = "addr:127.0.0.1"  # no auth: the client's address


def overrides(root, max_sessions: int) -> dict:
    # one DiT replica with room for the three sessions and the incarnations a killed ingress leaves
    # behind until their idle TTL; the parking keeps sessions 30 s (they are claimed well before)
    return {"worlds": {"enabled": True, "root": str(root)},
            "sessions": {"max_sessions": max_sessions, "resume": {"grace_s": 30.0}},
            "dit": {"num_replicas": 1}}


def stored(worlds: Worlds, tokens: dict[str, str]) -> dict[str, int]:
    out = {}
    for sid, token in tokens.items():
        try:
            out[sid] = worlds.manifest(PRINCIPAL, world_of_token(token_digest(token))).chunks
        except WorldNotFound:
            out[sid] = 0
    return out


def wait_stored(worlds: Worlds, tokens: dict[str, str], n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (have := stored(worlds, tokens)) != {sid: n for sid in tokens}:
        assert time.monotonic() < deadline, f"the store has {have} chunks, expected {n} each"
        time.sleep(0.1)




@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("worlds")


@pytest.fixture(scope="module", autouse=True)
def app_deleted_after(ray_port):
    """The module's app goes after its last test (its last tests leave it running: an idle app's
    replicas take CPU from the modules after it)."""
    yield
    serve.delete(APP)


def test_a_store_that_fails_mid_session_degrades_and_catches_up(extra_app, example, root):
    worlds = Worlds(LocalStore(root))
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
    app, connect = extra_app(APP, **overrides(root, 8))
    principals = root / "p"

    def health() -> dict:
        return httpx.get(f"{app.http}/healthz", timeout=10).json()

    async def go() -> tuple[list[FrameReply], list, dict, str]:
        async with connect() as c:
            await c.infer("lake", traj, 0, first=True, seed=3)
            replies = [await c.recv()]
            token = replies[0].resume_token
            await asyncio.to_thread(wait_stored, worlds, {"lake": token}, 1)
            os.rename(principals, root / "p.away")  # the store fails: every path under it loops
            os.symlink("p", principals)
            try:
                for k in (1, 2):
                    await c.infer("lake", traj, k, first=False)
                    replies.append(await c.recv())  # the stream goes on
                while not (during := await asyncio.to_thread(health))["worlds"]["degraded"]:
                    await asyncio.sleep(0.1)
            finally:
                os.unlink(principals)
                os.rename(root / "p.away", principals)
            for k in (3, 4):
                await c.infer("lake", traj, k, first=False)
                replies.append(await c.recv())
            await asyncio.to_thread(wait_stored, worlds, {"lake": token}, CHUNKS)
            await c.reset("lake")
            return replies, c.notices, during, token

    replies, notices, during, token = asyncio.run(go())
    assert [r.chunk_id for r in replies] == list(range(CHUNKS))
    assert during["status"] == "degraded" and during["worlds"]["queued"] >= 1 and during["worlds"]["failures"] >= 1
    assert [n.code for n in notices] == [ErrorCode.STORE_BEHIND]  # once for the outage
    world = worlds.load(PRINCIPAL, world_of_token(token_digest(token)))
    assert [c.video for c in world.chunks] == [r.video for r in replies]  # nothing lost
    assert httpx.get(f"{app.http}/healthz", timeout=10).json()["status"] == "ok"


def test_the_callers_worlds_over_http_list_video_export_import_delete(extra_app, example, root):
    app, connect = extra_app(APP, **overrides(root, 8))
    worlds = Worlds(LocalStore(root))
    http = f"{app.http}/v1/worlds"

    async def session() -> tuple[list[FrameReply], str]:
        async with connect() as c:
            replies = await c.run_session("walk", example, 3, seed=9)
            await c.reset("walk")
        return replies, replies[0].resume_token

    replies, token = asyncio.run(session())
    wait_stored(worlds, {"walk": token}, 3)
    world_id = world_of_token(token_digest(token))
    listed = {w["id"]: w for w in httpx.get(http, timeout=10).json()["data"]}
    assert listed[world_id]["title"] == "walk" and listed[world_id]["chunks"] == 3
    assert listed[world_id]["model"] == "tiny" and listed[world_id]["seed"] == 9
    video = httpx.get(f"{http}/{world_id}/video", timeout=30)
    assert video.status_code == 200 and video.content == b"".join(r.video for r in replies)  # the MP4 so far
    lwf = httpx.get(f"{http}/{world_id}/export", timeout=30)
    assert lwf.status_code == 200 and lwf.content[:8] == b"LWFWORLD"
    octet = {"Content-Type": "application/octet-stream"}
    imported = httpx.post(f"{http}/import", content=lwf.content, headers=octet, timeout=30)
    assert imported.status_code == 201, imported.text
    copy = imported.json()["id"]
    assert copy != world_id and imported.json()["chunks"] == 3
    assert httpx.get(f"{http}/{copy}/video", timeout=30).content == video.content
    refused = {
        "text": httpx.post(f"{http}/import", content=lwf.content, headers={"Content-Type": "text/plain"}, timeout=30),
        "flipped": httpx.post(f"{http}/import", content=lwf.content[:-5] + b"X" + lwf.content[-4:], headers=octet,
                              timeout=30),
        "cut": httpx.post(f"{http}/import", content=lwf.content[: len(lwf.content) // 2], headers=octet, timeout=30),
        "bad id": httpx.get(f"{http}/..etc..passwd/video", timeout=30),
        "unknown": httpx.get(f"{http}/w{'0' * 24}/export", timeout=30),
    }
    codes = {name: (r.status_code, r.json()["code"]) for name, r in refused.items()}
    assert codes == {"text": (415, "unsupported_media_type"), "flipped": (400, "bad_world_file"),
                     "cut": (400, "bad_world_file"), "bad id": (400, "bad_world_id"),
                     "unknown": (404, "world_not_found")}
    assert len(httpx.get(http, timeout=10).json()["data"]) == len(listed) + 1  # nothing of the refused imports
    assert httpx.delete(f"{http}/{copy}", timeout=30).json() == {"deleted": copy}
    gone = httpx.get(f"{http}/{copy}/video", timeout=30)
    assert (gone.status_code, gone.json()["code"]) == (404, "world_not_found")
    assert copy not in {w["id"] for w in httpx.get(http, timeout=10).json()["data"]}


def test_save_then_open_on_a_new_socket_continues_byte_identical(extra_app, example, root):
    """`save` after chunk 2 of 5 gives a world of its own (the session goes on); `open` of it on
    another socket continues from chunk 3 byte-identical to the uninterrupted session; another's
    or an unknown world id is `world_not_found`, a save of a session not held `bad_message`."""
    app, connect = extra_app(APP, **overrides(root, 8))
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)

    async def go():
        reference = await reference_videos(connect, "ref-open", traj, CHUNKS, 21)
        async with connect() as a:
            for k in range(3):
                await a.infer("orig", traj, k, first=k == 0, seed=21)
            first = [await a.recv() for _ in range(3)]
            await a.send(encode(SaveRequest(session_id="orig", title="a walk")))
            saved = await a.recv()
            await a.send(encode(SaveRequest(session_id="nobody", title="x")))
            refused = await a.recv()
            await a.infer("orig", traj, 3, first=False)  # the session goes on after its save
            assert isinstance(await a.recv(), FrameReply)
            await a.reset("orig")
        async with connect() as b:
            await b.send(encode(OpenRequest(session_id="again", world_id=w_unknown)))
            unknown = await b.recv()
            await b.send(encode(OpenRequest(session_id="again", world_id=saved.world_id)))
            opened = await b.recv()
            rest = []
            for k in (3, 4):
                await b.infer("again", traj, k, first=False)
                rest.append(await b.recv())
            await b.reset("again")
        return reference, first, saved, refused, unknown, opened, rest

    w_unknown = "w" + "1" * 24
    reference, first, saved, refused, unknown, opened, rest = asyncio.run(go())
    assert isinstance(saved, Saved) and saved.chunks == 3, saved
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BAD_MESSAGE, refused
    assert isinstance(unknown, ErrorReply) and unknown.code is ErrorCode.WORLD_NOT_FOUND, unknown
    assert isinstance(opened, Opened) and opened.next_chunk_id == 3 and opened.resume_token, opened
    assert [r.chunk_id for r in rest] == [3, 4]
    assert [r.video for r in first] + [r.video for r in rest] == reference  # byte-identical
    listed = {w["id"]: w for w in httpx.get(f"{app.http}/v1/worlds", timeout=10).json()["data"]}
    assert listed[saved.world_id]["title"] == "a walk" and listed[saved.world_id]["chunks"] == 3  # unchanged since


def test_three_sessions_survive_a_restart_a_deploy_and_a_killed_ingress(extra_app, example, root, replica_killer):
    worlds = Worlds(LocalStore(root))
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
    app, connect = extra_app(APP, **overrides(root, 8))
    tokens: dict[str, str] = {}
    videos: dict[str, list[bytes]] = {sid: [] for sid in SEEDS}
    replies_mime: dict[str, str] = {}

    async def references() -> dict[str, list[bytes]]:
        return {sid: await reference_videos(connect, f"ref-{sid}", traj, CHUNKS, seed) for sid, seed in SEEDS.items()}

    async def first_chunks() -> None:
        for sid, seed in SEEDS.items():
            async with connect() as c:
                await c.infer(sid, traj, 0, first=True, seed=seed)
                reply = await c.recv()
                assert isinstance(reply, FrameReply) and reply.chunk_id == 0, reply
                tokens[sid] = reply.resume_token
                videos[sid].append(reply.video)
                replies_mime[sid] = reply.mime_type

    async def resumed_chunk(k: int, acknowledged: Optional[int] = None) -> None:
        """Chunk k of each session on a new socket, resumed with its token; `acknowledged`: the
        chunks its client says it has (resume_from), those from it on come again first."""
        for sid in SEEDS:
            async with connect() as c:
                start = k if acknowledged is None else acknowledged
                await c.infer(sid, traj, k, first=False, resume_token=tokens[sid], resume_from=start)
                for j in range(start, k):  # sent again from the store's fMP4 bytes
                    again = await c.recv()
                    assert isinstance(again, FrameReply) and again.chunk_id == j, again
                    assert again.video == videos[sid][j] and again.mime_type == replies_mime[sid]
                reply = await c.recv()
                assert isinstance(reply, FrameReply) and reply.chunk_id == k, reply
                videos[sid].append(reply.video)

    reference = asyncio.run(references())
    asyncio.run(first_chunks())
    wait_stored(worlds, tokens, 1)

    serve.delete(APP)  # serve shutdown ... serve run: a new app, its parking knows no session
    app, connect = extra_app(APP, **overrides(root, 8))
    asyncio.run(resumed_chunk(1, acknowledged=0))  # chunk 0 unacknowledged: sent again from the store
    wait_stored(worlds, tokens, 2)

    app, connect = extra_app(APP, **overrides(root, 9))  # serve deploy with changed args: every replica replaced
    asyncio.run(resumed_chunk(2))
    wait_stored(worlds, tokens, 3)

    async def chunk_then_kill() -> None:
        """Chunk 3 on sockets that stay open while their ingress replica is killed."""
        conns = []
        try:
            for sid in SEEDS:
                conn = connect()
                c = await conn.__aenter__()
                conns.append(conn)
                await c.infer(sid, traj, 3, first=False, resume_token=tokens[sid], resume_from=3)
                reply = await c.recv()
                assert isinstance(reply, FrameReply) and reply.chunk_id == 3, reply
                videos[sid].append(reply.video)
            await asyncio.to_thread(wait_stored, worlds, tokens, 4)
            replica_killer(APP, "WorldIngress", c.config.debug["ingress_replica"])
        finally:
            for conn in conns:
                try:
                    await conn.__aexit__(None, None, None)
                except Exception:  # noqa: BLE001 - the socket died with its replica
                    pass

    asyncio.run(chunk_then_kill())
    wait_healthy(app.http)
    asyncio.run(resumed_chunk(4))
    assert videos == reference  # every session byte-identical to its uninterrupted run
    wait_stored(worlds, tokens, CHUNKS)
    health = httpx.get(f"{app.http}/healthz", timeout=10).json()
    assert health["status"] == "ok" and health["worlds"]["degraded"] is False and health["worlds"]["written"] == 3
    print("seconds from a chunk's reply to the store (this ingress replica):", health["worlds"]["write_s_p50"],
          "p50,", health["worlds"]["write_s_max"], "max")
    for sid, token in tokens.items():  # what the client received is what the store keeps
        world = worlds.load(PRINCIPAL, world_of_token(token_digest(token)))
        assert [c.video for c in world.chunks] == videos[sid]
    serve.delete(APP)


def test_the_sync_client_saves_and_opens_a_key_driven_session(extra_app, example, root):
    """SyncWorldClient.save() / open(): a session driven by keys, saved after 2 chunks and
    opened on another client, makes its third chunk with the keys continuing the last stored
    pose: the same bytes as the uninterrupted session's third chunk, decodable with the world's
    init segment."""
    from client.sync import SyncWorldClient
    from protocol.requests import SessionStart

    app, _ = extra_app(APP, **overrides(root, 8))
    start = SessionStart(example.image, example.prompt, seed=4)
    keys = (["w"], ["w", "j"], ["d"])
    with SyncWorldClient(app.ws) as c:
        reference = [c.step("ref-keys", k, start=start if i == 0 else None) for i, k in enumerate(keys)]
        c.reset("ref-keys")
        first = [c.step("keys", k, start=start if i == 0 else None) for i, k in enumerate(keys[:2])]
        saved = c.save("keys", "two steps")
        c.reset("keys")
    with SyncWorldClient(app.ws) as d:
        opened = d.open(saved.world_id, "reopened")
        third = d.step("reopened", keys[2])
        d.reset("reopened")
    assert saved.chunks == 2 and opened.next_chunk_id == 2 and opened.init_segment
    assert [x.video for x in first] + [third.video] == [x.video for x in reference]
    assert third.reply.chunk_id == 2 and third.frames.shape[0] == 12


def test_lwf_client_lists_exports_imports_and_deletes_worlds(extra_app, example, root, tmp_path, capsys):
    """`lwf-client worlds / export / import / delete` against the server's /v1/worlds routes."""
    from client.cli import main

    app, connect = extra_app(APP, **overrides(root, 8))

    async def session() -> str:
        async with connect() as c:
            replies = await c.run_session("cli", example, 2, seed=31)
            await c.reset("cli")
        return replies[0].resume_token

    token = asyncio.run(session())
    worlds = Worlds(LocalStore(root))
    wait_stored(worlds, {"cli": token}, 2)
    world_id = world_of_token(token_digest(token))
    url = ["--url", app.ws]
    capsys.readouterr()
    assert main(["worlds", *url]) == 0 and world_id in capsys.readouterr().out
    out = tmp_path / "w.lwf"
    assert main(["export", world_id, "-o", str(out), *url]) == 0 and out.read_bytes()[:8] == b"LWFWORLD"
    capsys.readouterr()
    assert main(["import", str(out), *url]) == 0
    copy = capsys.readouterr().out.split(" as ")[1].split()[0]
    assert worlds.load(PRINCIPAL, copy).chunks[1].video == worlds.load(PRINCIPAL, world_id).chunks[1].video
    assert main(["delete", copy, *url]) == 0
    assert main(["export", copy, "-o", str(tmp_path / "gone.lwf"), *url]) == 1
    assert "server error (world_not_found)" in capsys.readouterr().err
