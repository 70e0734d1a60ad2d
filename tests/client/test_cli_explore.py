"""Exploration through the served app: `lwf-client drive` (keys), `--fork-at` / `--rewind-to`
with the branch in its own MP4, `--save-session`, `compare` of a session and its branch, and the
Python client's `control` / `fork` / `rewind`."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from camera.keys import KeySteps, key_chunk_poses
from client.compare import LABEL_MIN_PX
from client.errors import ServerError
from client.session import WorldClient
from client.trajectory import Trajectory, plan_session
from protocol.errors import ErrorCode
from support import EXAMPLES

LWF_CLIENT = Path(sys.executable).parent / "lwf-client"


def run_cli(*args: object, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(LWF_CLIENT), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def decode_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_drive_plays_a_key_script_and_saves_the_session(served, tmp_path):
    out, saved = tmp_path / "drive.mp4", tmp_path / "session"
    r = run_cli("drive", "w:2,j+w:1", "--url", served.ws, "--seed", 5, "--out", out, "--save-session", saved)
    assert r.returncode == 0, r.stderr
    assert decode_frames(out).shape == (9 + 12 + 12, 32, 48, 3)
    assert "control lag (control sent -> first frame with its event_id): median" in r.stdout
    assert "over 2 key states" in r.stdout
    lines = [json.loads(x) for x in (saved / "main" / "replies.jsonl").read_text().splitlines()]
    assert [x["chunk_id"] for x in lines] == [0, 1, 2]
    assert [x["event_id"] for x in lines] == [1, 1, 2]  # a control only when the key state changes
    expected = [key_chunk_poses(None, {"w"}, KeySteps())]
    for keys in ({"w"}, {"w", "j"}):
        expected.append(key_chunk_poses(expected[-1][-1], keys, KeySteps()))
    for line, poses in zip(lines, expected):  # the server integrated the keys as camera/keys.py says
        np.testing.assert_allclose(np.array(line["poses"]), poses, atol=1e-6)
    payloads = b"".join((saved / "main" / f"chunk_{k:04d}.m4s").read_bytes() for k in range(3))
    assert payloads == out.read_bytes() == (saved / "main.mp4").read_bytes()
    meta = json.loads((saved / "session.json").read_text())
    assert meta["key_script"] == [["w"], ["w"], ["w", "j"]] and meta["num_frames"] == 33
    assert meta["command"][:2] == ["drive", "w:2,j+w:1"]
    assert meta["branches"]["main"]["chunks"] == 3


def test_fork_repeating_the_inputs_is_byte_identical_and_a_rewind_branch_differs(served, tmp_path):
    main, fork = tmp_path / "main.mp4", tmp_path / "main.branch.mp4"
    r = run_cli("play", EXAMPLES / "00", "--url", served.ws, "--frames", 33, "--out", main, "--fork-at", 1)
    assert r.returncode == 0, r.stderr
    assert "forked at chunk 1: wrote" in r.stdout and "(2 new chunks after 1 kept" in r.stdout
    assert fork.read_bytes() == main.read_bytes()  # the same inputs after the fork: the same bytes

    saved, rewound, side = tmp_path / "s", tmp_path / "rewound.mp4", tmp_path / "side.mp4"
    r = run_cli("play", EXAMPLES / "00", "--url", served.ws, "--frames", 33, "--out", main, "--rewind-to", 2,
                "--branch-keys", "l:1", "--branch-prompt", "a snowy street", "--branch-out", rewound,
                "--save-session", saved)
    assert r.returncode == 0, r.stderr
    assert "rewound at chunk 2: wrote" in r.stdout
    a, b = decode_frames(main), decode_frames(rewound)
    assert a.shape == b.shape == (33, 32, 48, 3)
    np.testing.assert_array_equal(a[:21], b[:21])  # chunks 0 and 1 kept
    assert np.abs(a[21:].astype(int) - b[21:].astype(int)).mean() > 1  # chunk 2 taken another way
    branch = [json.loads(x) for x in (saved / "branch" / "replies.jsonl").read_text().splitlines()]
    assert [(x["chunk_id"], x["event_id"]) for x in branch] == [(2, 1)]
    assert sorted(p.name for p in (saved / "inputs").iterdir()) == ["image.jpg", "intrinsics.npy", "poses.npy",
                                                                   "prompt.txt"]

    r = run_cli("compare", main, rewound, "-o", side)
    assert r.returncode == 0, r.stderr
    frames = decode_frames(side)
    assert frames.shape == (33, LABEL_MIN_PX + 32, 48 + 4 + 48, 3)  # the videos under their names
    left = np.abs(frames[:, LABEL_MIN_PX:, :48].astype(int) - decode_frames(main).astype(int)).mean()
    assert left < 16, left  # the main session below the band (noise re-encoded once more: ~8 measured)


def test_the_python_client_forks_rewinds_and_controls(served):
    traj = Trajectory.load([EXAMPLES / "00"])
    plan = plan_session(traj, 33)

    async def go():
        async with await WorldClient.connect(served.ws) as c:
            first = traj.messages(plan, "py", seed=3)
            for m in first[:2]:
                await c.send(m)
                await c.receive(60)
            with pytest.raises(ServerError) as refused:
                await c.fork("nobody", "x", 1)
            forked = await c.fork("py", "py-b", 1)
            await c.control("py-b", ["d"], 7)
            reply = await c.infer_keys("py-b", timeout_s=60)
            rewound = await c.rewind("py", 0)
            await c.reset("py-b")
            await c.reset("py")
            return refused.value, forked, reply, rewound

    refused, forked, reply, rewound = asyncio.run(go())
    assert refused.code is ErrorCode.BAD_MESSAGE
    assert (forked.session_id, forked.parent_session_id, forked.next_chunk_id) == ("py-b", "py", 1)
    assert (reply.session_id, reply.chunk_id, reply.event_id) == ("py-b", 1, 7)
    np.testing.assert_allclose(reply.poses, key_chunk_poses(plan.chunk_poses[0][-1].astype(np.float64), {"d"},
                                                            KeySteps()), atol=1e-5)
    assert rewound.next_chunk_id == 0
