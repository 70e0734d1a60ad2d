"""Watching a shared world from Python (issue 56 item 8): `SyncWorldClient.share()` / `.watch()`,
`watch(link)` and `lwf-client watch LINK --out watched.mp4`, against the served app; where a link
points (`watch_target`) and what a viewer refuses (`WatchGuard`), without one."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import av
import msgpack
import numpy as np
import pytest

from client.errors import BadReply, ServerError
from client.reply_guard import WatchGuard
from client.sync import Chunk, SyncWorldClient, watch
from client.synthetic import default_image
from client.watching import watch_target
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.requests import SessionStart
from protocol.sharing import Watching, WorldNotice
from scripted_server import scripted_server, video
from support import REPO

START = SessionStart(default_image(), "a quiet street", seed=11, num_frames=81, translation_scale=0.2)
WATCH = "/v1/realtime/world/watch"


def decoded(data: bytes) -> tuple[list[int], np.ndarray]:
    with av.open(io.BytesIO(data), format="mp4") as container:
        frames = list(container.decode(video=0))
    return [f.pts for f in frames], np.stack([f.to_ndarray(format="rgb24") for f in frames])


def chunks(w, n: int) -> list[Chunk]:
    """The next `n` chunks a viewer gets (the notices between them passed over)."""
    got = []
    while len(got) < n:
        if isinstance(item := next(w), Chunk):
            got.append(item)
    return got


def share_link(served, world_id: str, token: str) -> str:
    return f"{served.http}/w/{world_id}#token={token}"


# ---- where a link points ----

@pytest.mark.parametrize("link, token, server, expected", [
    ("http://h:8000/w/wA_1#token=t-0", None, None, ("ws://h:8000" + WATCH, "wA_1", "t-0")),
    ("https://h/world/w/wA#token=t", None, None, ("wss://h/world" + WATCH, "wA", "t")),  # a route prefix kept
    ("ws://h:8000" + WATCH + "?world=wA", "t", None, ("ws://h:8000" + WATCH, "wA", "t")),
    (WATCH + "?world=wA", "t", "ws://h:9/v1/realtime/world/camera", ("ws://h:9" + WATCH, "wA", "t")),  # `watch_url`
    ("wA", "t", "http://h:9", ("ws://h:9" + WATCH, "wA", "t")),  # a `shared` answer's world_id
    ("/w/wA#token=t", None, "wss://h/p/v1/realtime/world/camera", ("wss://h/p" + WATCH, "wA", "t")),
])
def test_where_a_link_points(link, token, server, expected):
    target = watch_target(link, token, server)
    assert (target.url, target.world_id, target.token) == expected


@pytest.mark.parametrize("link, token, why", [
    ("http://h/w/wA", None, "no watch token"),
    ("http://h/w/wA#token=t", "other", "another token"),
    ("http://h/elsewhere#token=t", None, "neither a share link"),
    ("http://h/w/<b>#token=t", None, "names no world id"),
    ("ftp://h/w/wA#token=t", None, "cannot tell the server"),
])
def test_a_link_that_points_nowhere_is_a_value_error(link, token, why):
    with pytest.raises(ValueError, match=why):
        watch_target(link, token)


# ---- what a viewer refuses ----

def _frame(world_id: str, chunk_id: int, video: bytes, num_frames: int = 12) -> bytes:
    return msgpack.packb({"type": "frame", "session_id": world_id, "chunk_id": chunk_id, "video": video,
                          "num_frames": num_frames, "resolution": [32, 48], "fps": 16})


def test_a_viewer_refuses_another_world_and_a_first_frame_without_its_init_segment():
    fragment = b"\x00\x00\x00\x18moof\x00\x00\x00\x10mfhd\x00\x00\x00\x00\x00\x00\x00\x01" \
               b"\x00\x00\x00\x08traf" + b"\x00\x00\x00\x08mdat"
    guard = WatchGuard("wA")
    with pytest.raises(BadReply, match="expected `watching`"):
        guard.take(encode(Watching(world_id="wB", viewers=1, controls="owner")))
    assert guard.take(encode(Watching(world_id="wA", viewers=1, controls="owner"))).world_id == "wA"
    with pytest.raises(BadReply, match="does not watch"):
        guard.take(_frame("wB", 3, fragment))
    with pytest.raises(BadReply, match="init segment"):
        guard.take(_frame("wA", 3, fragment))  # a viewer's first frame starts with the init segment
    with pytest.raises(BadReply, match="does not watch"):
        guard.take(encode(WorldNotice(world_id="wB", event="viewers", viewers=2)))
    with pytest.raises(BadReply, match="not `config`"):
        guard.take(msgpack.packb({"type": "config", "model": "x"}))


# ---- against the served app ----

def test_share_watch_and_unshare_from_python(served):
    """The owner shares after chunk 0: a viewer gets chunk 0 (its first frame, with the init
    segment) and the next ones, the owner's bytes; `unshare` ends it (`ended`, then the end)."""
    with SyncWorldClient(served.ws) as c:
        owned = [c.step("py-share", [], start=START)]
        shared = c.share("py-share")
        assert shared.audience == "link" and shared.watch_url == f"{WATCH}?world={shared.world_id}"
        with c.watch(shared.world_id, shared.watch_token) as w:
            assert w.watching.next_chunk_id == 0 and w.viewers == 1
            owned += [c.step("py-share", ["w"]), c.step("py-share", ["w", "j"])]
            got = chunks(w, 3)
            assert [k.chunk_id for k in got] == [0, 1, 2]
            assert [k.video for k in got] == [k.video for k in owned]  # the same fMP4 bytes
            np.testing.assert_array_equal(got[2].frames, owned[2].frames)  # decodes with the world's init segment
            assert c.unshare("py-share").world_id == shared.world_id
            rest = list(w)
            assert rest[-1].event == "ended" and all(isinstance(x, WorldNotice) for x in rest)
            assert w.ended is not None
        with pytest.raises(ServerError) as refused:  # the token opens nothing any more
            watch(share_link(served, shared.world_id, shared.watch_token))
        assert refused.value.code is ErrorCode.UNAUTHORIZED
        c.reset("py-share")


def test_lwf_client_watch_writes_what_came_as_one_mp4(served, tmp_path):
    """`lwf-client watch LINK` in a process of its own: it joins after chunk 0, gets the owner's
    chunks until `unshare`, and writes them as one MP4 playing from 0 (media/retime.py), whose
    frames are the owner's."""
    out = tmp_path / "watched.mp4"
    with SyncWorldClient(served.ws) as c:
        owned = [c.step("cli-share", [], start=START)]
        shared = c.share("cli-share")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        cli = subprocess.Popen([sys.executable, "-m", "client.cli", "watch",
                                share_link(served, shared.world_id, shared.watch_token), "--out", str(out)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert cli.stderr.readline().startswith(f"watching world {shared.world_id} (1 watching")
            owned += [c.step("cli-share", ["w"]), c.step("cli-share", ["d"])]
            c.unshare("cli-share")
            stdout, stderr = cli.communicate(timeout=120)
        finally:
            cli.kill()
        c.reset("cli-share")
    assert cli.returncode == 0, stderr
    assert "the world ended: the owner unshared it" in stderr
    first = int(re.search(r"from the world's chunk (\d+)", stdout)[1])
    pts, frames = decoded(out.read_bytes())
    want = np.concatenate([k.frames for k in owned[first:]])
    np.testing.assert_array_equal(frames, want)
    assert pts == [1000 * i for i in range(len(want))]  # from 0, back to back
    assert f"wrote {out} ({3 - first} chunks, {len(want)} frames" in stdout


def test_lwf_client_watch_of_a_bad_token_is_refused_in_one_line(served, tmp_path, capsys):
    from client.cli import main

    code = main(["watch", f"{served.http}/w/wNoSuchWorld#token=nope", "--out", str(tmp_path / "x.mp4")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("server error (unauthorized)") and len(err.splitlines()) == 1
    assert not (tmp_path / "x.mp4").exists()


# ---- against a hostile server (scripted, no Ray) ----

@pytest.mark.parametrize("replies, why", [
    ([_frame("wA", 0, video(0, 9), 9), _frame("wB", 1, video(1, 12))], "which this viewer does not watch"),
    ([_frame("wA", 0, video(0, 9), 9), encode(WorldNotice(world_id="wB", event="ended", viewers=0))],
     "which this viewer does not watch"),
    ([_frame("wA", 1, video(1, 12))], "the first frame reply does not start with the init segment"),
    ([_frame("wA", 0, video(0, 9), 9), msgpack.packb({"type": "frame"})], "session_id|field"),
])
def test_lwf_client_watch_refuses_a_hostile_reply_and_writes_nothing(replies, why, tmp_path, capsys):
    """A reply a viewer refuses (after a good chunk, or as the first): exit 1, one line, no file."""
    from client.cli import main

    def script(ws) -> None:
        ws.recv()  # the `watch`
        for reply in replies:
            ws.send(reply)
        ws.recv()  # until the client closes

    with scripted_server(script, handshake=encode(Watching(world_id="wA", viewers=1, controls="owner"))) as url:
        code = main(["watch", url.replace("/camera", "/watch") + "?world=wA", "--token", "t",
                     "--out", str(tmp_path / "w.mp4")])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and err[-1].startswith("error: refused the server's reply") and re.search(why, err[-1]), err
    assert not (tmp_path / "w.mp4").exists()
