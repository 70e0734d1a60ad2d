"""`lwf-client` end to end against the served app (subprocesses, as a user runs it)."""
from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import requests

from client.synthetic import synthetic_trajectory
from session_holders import hold_sessions
from support import EXAMPLES

LWF_CLIENT = Path(sys.executable).parent / "lwf-client"  # the console script (pyproject [project.scripts])


def cli(*args: object) -> list[str]:
    return [str(LWF_CLIENT), *map(str, args)]


def run_cli(*args: object, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=timeout)


def decode_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_play_example_writes_the_mp4_and_a_summary(served, tmp_path):
    out = tmp_path / "ex00.mp4"
    # an http:// base URL is accepted: the client switches to ws:// and adds the camera path
    r = run_cli("play", EXAMPLES / "00", "--url", served.http, "--frames", 33, "--seed", 3, "--out", out)
    assert r.returncode == 0, r.stderr
    frames = decode_frames(out)
    assert frames.shape == (33, 32, 48, 3)  # 9 + 12 + 12
    assert f"wrote {out} (33 frames at 16 fps" in r.stdout
    for line in ("chunks: 3, frames: 33", "time to first chunk:", "chunk interval: p50", "fps vs 16 fps",
                 "stages (mean per computed chunk): text_encode"):
        assert line in r.stdout, r.stdout
    # the handshake says random_weights (the embedded tiny model): the summary says so, as the page does
    assert "the server's tiny model has random weights: the video is coloured noise that follows the camera" \
        in r.stdout.splitlines()[-1], r.stdout
    assert "3/3" in r.stderr and "chunk 2:" in r.stderr  # tqdm progress with the per-chunk latency


def test_synthetic_trajectory_is_saved_and_replays_identically(served, tmp_path):
    saved, first, again = tmp_path / "orbit", tmp_path / "orbit.mp4", tmp_path / "again.mp4"
    r = run_cli("orbit", "--url", served.ws, "--frames", 21, "--degrees", 30, "--save-trajectory", saved,
                "--out", first)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in saved.iterdir()) == ["image.png", "intrinsics.npy", "poses.npy", "prompt.txt"]
    assert np.load(saved / "poses.npy").shape == (21, 4, 4)
    assert decode_frames(first).shape == (21, 32, 48, 3)  # 9 + 12
    r = run_cli("play", saved, "--url", served.ws, "--frames", 21, "--out", again)
    assert r.returncode == 0, r.stderr
    assert again.read_bytes() == first.read_bytes()


def test_input_errors_are_reported_with_their_code(served, tmp_path):
    r = run_cli("pan", "--url", served.ws, "--size", "8*8", "--out", tmp_path / "x.mp4")
    assert r.returncode == 2
    assert "invalid input (bad_message): `size` must be" in r.stderr
    r = run_cli("play", tmp_path, "--url", served.ws)
    assert r.returncode == 2 and "missing image, poses.npy, intrinsics.npy, prompt.txt" in r.stderr
    r = run_cli("dolly", "--url", "ws://127.0.0.1:9/v1/realtime/world/camera", "--out", tmp_path / "x.mp4")
    assert r.returncode == 1 and "cannot reach the server" in r.stderr


def read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """Read the process's stderr (unbuffered) until `text` appears."""
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        assert time.monotonic() < deadline, f"{text!r} not seen in: {seen.decode(errors='replace')}"
        if select.select([proc.stderr], [], [], 0.2)[0]:
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, f"the client ended before {text!r}: {seen.decode(errors='replace')}"
            seen += chunk
    return seen.decode(errors="replace")


def test_a_full_server_puts_the_cli_in_line_and_it_starts_when_a_place_frees(served, tmp_path):
    """Issue 46: the app's waiting room is on (the default): with both DiT slots held, the CLI's
    session waits in line (its position shown), and starts once a holder leaves. The busy
    retries of a server without a line are tested against a scripted server (test_streaming)."""
    async def scenario() -> None:
        holders = await hold_sessions(served.ws, 2)  # the DiT replica's 2 slots
        out = tmp_path / "line.mp4"
        proc = subprocess.Popen(cli("pan", "--url", served.ws, "--frames", 9, "--out", out),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            try:
                seen = await asyncio.to_thread(read_until, proc, "waiting in the server's line: position 1", 60)
                assert "server busy" not in seen
            finally:
                for c in holders:
                    await c.close()  # frees the slots
            stdout, stderr = await asyncio.to_thread(proc.communicate, timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr
        assert decode_frames(out).shape[0] == 9
        assert "s in the server's line for a place" in stdout.decode()

    asyncio.run(scenario())


def _ctrl_c_deliverable() -> None:
    """In the child: SIGINT's default disposition. A shell without job control starts background
    commands with SIGINT ignored, and Python then keeps ignoring it (pytest run with `&`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_resets_the_session_and_closes(served, tmp_path):
    proc = subprocess.Popen(cli("dolly", "--url", served.ws, "--frames", 81, "--pipeline", 1,
                                "--out", tmp_path / "never.mp4"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_ctrl_c_deliverable)
    try:
        read_until(proc, "chunk 0:", 60)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted: session reset, connection closed" in stderr.decode()
    assert not (tmp_path / "never.mp4").exists()
    deadline = time.monotonic() + 15
    while True:  # the server holds no session any more
        held = requests.get(f"{served.http}/v1/models", timeout=10).json()["data"][0]["sessions"]["held"]
        if held == 0:
            break
        assert time.monotonic() < deadline, f"{held} sessions still held"
        time.sleep(0.25)


def test_prompt_at_builds_a_prompt_schedule():
    """--prompt-at CHUNK:TEXT (repeatable) -> prompt_update on those chunks' infers."""
    import argparse

    import pytest

    from client.trajectory import plan_session
    from client.cli import prompt_at
    from client.synthetic import synthetic_trajectory
    from protocol import decode

    assert prompt_at("2:a snowy street") == (2, "a snowy street")
    assert prompt_at("1:a: b") == (1, "a: b")
    for bad in ("0:x", "x:y", "3", "2:"):
        with pytest.raises(argparse.ArgumentTypeError):
            prompt_at(bad)
    traj = synthetic_trajectory("dolly", 33)
    plan = plan_session(traj, 33)
    reqs = [decode(m) for m in traj.messages(plan, "s", prompt_schedule=dict([prompt_at("2:snow")]))]
    assert [r.prompt_update for r in reqs] == [None, None, "snow"]
    assert reqs[0].prompt == traj.prompt and reqs[2].prompt is None


def test_frames_rounded_down_are_reported_before_connecting(tmp_path):
    """`--frames 10` makes 9 frames (9 for the first chunk, then 12 per chunk): the CLI says so
    on stderr (here before it fails to reach a server that is not there); 21 is made as asked."""
    url = "ws://127.0.0.1:9/v1/realtime/world/camera"
    r = run_cli("dolly", "--url", url, "--frames", 10, "--out", tmp_path / "x.mp4", timeout=60)
    assert r.returncode == 1 and "cannot reach the server" in r.stderr
    assert "--frames 10 rounded down to 9: videos are 9 frames for the first chunk, then 12 per chunk" in r.stderr
    r = run_cli("dolly", "--url", url, "--frames", 21, "--out", tmp_path / "x.mp4", timeout=60)
    assert r.returncode == 1 and "rounded" not in r.stderr
    synthetic_trajectory("orbit", 21).save(tmp_path / "short")
    r = run_cli("play", tmp_path / "short", "--url", url, "--frames", 33, "--out", tmp_path / "x.mp4", timeout=60)
    assert r.returncode == 1 and "--frames 33 rounded down to 21: the trajectory has 21 poses" in r.stderr
