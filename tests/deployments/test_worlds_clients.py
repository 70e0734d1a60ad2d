"""Saved worlds from the clients, and `reopen` (issue 55 items 3 and 7), through the real app with
the store on (a local folder): `lwf-client drive ... --save TITLE` saves the session and prints
its id, `lwf-client open WORLD_ID --keys ...` continues it byte-identical to the uninterrupted
run; after a deploy that changes a field of the model fingerprint (`sessions.memory_fraction`),
`open` is refused with `world_changed` naming the field (its values then and now) and the world
to reopen, and `reopen` (the protocol message, SyncWorldClient.reopen and `lwf-client reopen`)
runs the world's inputs again as a new session: as many new chunks as the world holds, from
chunk 0."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
from ray import serve

from media.reassembly import split_init
from support import EXAMPLES
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply, OpenRequest, Reopened, ReopenRequest, Saved, SaveRequest

APP = "worlds-clients"
CHUNKS = 3
FRAMES = 57  # declares 5 chunks: 3 made, then the reopened session goes on


def overrides(root, memory_fraction=None) -> dict:
    return {"worlds": {"enabled": True, "root": str(root)},
            "sessions": {"max_sessions": 4, "resume": {"grace_s": 30.0}, "memory_fraction": memory_fraction},
            "dit": {"num_replicas": 1}}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("worlds-clients")


def saved_id(out: str) -> str:
    return out.split(" as world ")[1].split()[0]


def test_lwf_client_saves_a_drive_and_opens_it_with_keys(extra_app, root, tmp_path, capsys):
    """`--save` at the end of `drive` prints the world's id (the session open-ended); `open WORLD_ID --keys d:1` writes the
    world's init segment and the next chunk: the bytes the uninterrupted drive made."""
    from client.cli import main

    app, _ = extra_app(APP, **overrides(root))
    url = ["--url", app.ws, "--seed", "5"]
    ref, first, more = tmp_path / "ref.mp4", tmp_path / "first.mp4", tmp_path / "more.mp4"
    # --save makes a session open-ended (it declares no length, so that it can go on): the
    # uninterrupted reference is saved too
    assert main(["drive", "w:2,d:1", "--out", str(ref), "--save", "reference", *url]) == 0
    capsys.readouterr()
    assert main(["drive", "w:2", "--out", str(first), "--save", "two steps", *url]) == 0
    out = capsys.readouterr().out
    world = saved_id(out)
    assert "(2 chunks, \"two steps\")" in out and f"lwf-client open {world}" in out
    assert main(["open", world, "--keys", "d:1", "--out", str(more), "--url", app.ws]) == 0
    assert f"opened {world}" in capsys.readouterr().out
    init, _ = split_init(ref.read_bytes())
    continued = more.read_bytes()
    assert continued.startswith(init) and len(continued) > len(init)
    assert ref.read_bytes() == first.read_bytes() + continued[len(init):]  # chunk 2 as the uninterrupted drive's
    traj = tmp_path / "traj.mp4"  # the cameras of a trajectory's chunks 1 and 2 go on from the world's chunk 2
    assert main(["open", world, "--trajectory", str(EXAMPLES / "00"), "--frames", "33", "--out", str(traj),
                 "--url", app.ws]) == 0
    assert "wrote" in capsys.readouterr().out and traj.read_bytes().startswith(init)
    assert traj.read_bytes().count(b"moof") == 2
    assert main(["open", "w" + "0" * 24, "--keys", "d:1", "--out", str(tmp_path / "x.mp4"), "--url", app.ws]) == 1
    assert "server error (world_not_found)" in capsys.readouterr().err


def test_reopen_runs_a_changed_worlds_inputs_again(extra_app, example, root, tmp_path, capsys):
    """A world of 3 chunks saved under one model setup; the app deployed again with
    `sessions.memory_fraction` set: `open` is `world_changed` naming it and the world; `reopen`
    answers `reopened` and 3 new chunks 0, 1, 2 of a new session, which then goes on."""
    from client.cli import main
    from client.sync import SyncWorldClient

    app, connect = extra_app(APP, **overrides(root))
    traj = dataclasses.replace(example, num_frames=FRAMES)

    async def made() -> tuple[list[FrameReply], Saved]:
        async with connect() as c:
            for k in range(CHUNKS):
                await c.infer("made", traj, k, first=k == 0, seed=9)
            chunks = [await c.recv() for _ in range(CHUNKS)]
            await c.send(encode(SaveRequest(session_id="made", title="before the upgrade")))
            saved = await c.recv()
            await c.reset("made")
        return chunks, saved

    _, saved = asyncio.run(made())
    assert isinstance(saved, Saved) and saved.chunks == CHUNKS, saved

    app, connect = extra_app(APP, **overrides(root, memory_fraction=0.5))  # the fingerprint changes

    async def after() -> tuple:
        async with connect() as c:
            for k in range(CHUNKS):  # the same inputs sent anew: what the served model makes of them
                await c.infer("fresh", traj, k, first=k == 0, seed=9)
            fresh = [await c.recv() for _ in range(CHUNKS)]
            await c.reset("fresh")
            await c.send(encode(OpenRequest(session_id="again", world_id=saved.world_id)))
            refused = await c.recv()
            await c.send(encode(ReopenRequest(session_id="again", world_id=saved.world_id)))
            reopened = await c.recv()
            chunks = [await c.recv() for _ in range(CHUNKS)]
            await c.infer("again", traj, CHUNKS, first=False)  # the new session goes on
            next_one = await c.recv()
            await c.reset("again")
        return fresh, refused, reopened, chunks, next_one

    fresh, refused, reopened, chunks, next_one = asyncio.run(after())
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.WORLD_CHANGED, refused
    assert refused.changed == ["memory_fraction"] and refused.world_id == saved.world_id
    assert "memory_fraction: None -> 0.5" in refused.message and "reopen" in refused.message
    assert isinstance(reopened, Reopened), reopened
    assert (reopened.chunks, reopened.changed, reopened.world_id) == (CHUNKS, ["memory_fraction"], saved.world_id)
    assert [(type(r), r.chunk_id, r.session_id) for r in chunks] == [(FrameReply, k, "again") for k in range(CHUNKS)]
    assert chunks[0].resume_token and chunks[0].video[4:8] == b"ftyp"
    # the image, prompt, seed, size, declared length and cameras run again as they were: the bytes
    # of the same inputs sent anew to the served model (on a CPU replica memory_fraction sizes the
    # KV budget, so they need not be the original's)
    assert [r.video for r in chunks] == [r.video for r in fresh]
    assert isinstance(next_one, FrameReply) and next_one.chunk_id == CHUNKS, next_one

    with SyncWorldClient(app.ws) as c:
        ok, sync_chunks = c.reopen(saved.world_id, "sync")
        assert ok.chunks == CHUNKS and [x.chunk_id for x in sync_chunks] == list(range(CHUNKS))
        assert sync_chunks[-1].frames.shape[0] == 12
        c.reset("sync")

    out = tmp_path / "reopened.mp4"
    capsys.readouterr()
    assert main(["open", saved.world_id, "--keys", "w:1", "--out", str(tmp_path / "no.mp4"), "--url", app.ws]) == 1
    err = capsys.readouterr().err
    assert "server error (world_changed)" in err and f"lwf-client reopen {saved.world_id}" in err
    assert main(["reopen", saved.world_id, "--keys", "w:1", "--out", str(out), "--url", app.ws]) == 0
    assert "changed: memory_fraction" in capsys.readouterr().out
    reopened_mp4 = out.read_bytes()
    assert reopened_mp4.startswith(b"".join(r.video for r in fresh))  # 3 chunks, then the key-driven 4th
    assert len(reopened_mp4) > len(b"".join(r.video for r in fresh))
    serve.delete(APP)
