"""`POST /v1/videos` against the served app: the same video as the streamed CLI run, the
WebSocket's validation and error codes, the body cap and the job bound."""
from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
import pytest
import requests

from client.session import WorldClient
from client.trajectory import Trajectory
from protocol.messages import ErrorReply
from support import EXAMPLES

LWF_CLIENT = Path(sys.executable).parent / "lwf-client"
SEED = 11
BODY_CAP_MIB = 4  # videos.max_body_mib of the served app (tests/client/conftest.py); max_jobs is 1


@pytest.fixture(scope="module")
def ex00() -> Trajectory:
    return Trajectory.load([EXAMPLES / "00"])


def body(traj: Trajectory, frames: int = 33, n: int = 40, **extra) -> dict:
    return {"image": base64.b64encode(traj.image).decode(), "prompt": traj.prompt,
            "poses": traj.poses[:n].tolist(), "intrinsics": traj.intrinsics[:n].tolist(),
            "num_frames": frames, "seed": SEED, **extra}


def frames_of(mp4: bytes) -> np.ndarray:
    import io

    import av

    with av.open(io.BytesIO(mp4), format="mp4") as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_video_equals_the_streamed_cli_result(served, ex00, tmp_path):
    cli_out = tmp_path / "cli.mp4"
    r = subprocess.run([str(LWF_CLIENT), "play", str(EXAMPLES / "00"), "--url", served.ws, "--frames", "33",
                        "--seed", str(SEED), "--out", str(cli_out)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    streamed = frames_of(cli_out.read_bytes())

    resp = requests.post(f"{served.http}/v1/videos", json=body(ex00), timeout=180)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "video/mp4" and resp.headers["x-video-frames"] == "33"
    assert streamed.shape == (33, 32, 48, 3)
    np.testing.assert_array_equal(frames_of(resp.content), streamed)

    # the same as a job: progress, then the content
    job = requests.post(f"{served.http}/v1/videos", params={"async": "true"}, json=body(ex00), timeout=30)
    assert job.status_code == 202, job.text
    view = job.json()
    assert (view["chunks_total"], view["num_frames"]) == (3, 33)
    progress = []
    deadline = time.monotonic() + 120
    while view["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
        view = requests.get(f"{served.http}{view['status_url']}", timeout=10).json()
        progress.append(view["progress"])
    assert view["status"] == "succeeded", view
    assert progress == sorted(progress) and progress[-1] == 1.0
    content = requests.get(f"{served.http}{view['content_url']}", timeout=30)
    assert content.status_code == 200
    np.testing.assert_array_equal(frames_of(content.content), streamed)


async def ws_error(url: str, fields: dict) -> ErrorReply:
    """What the WebSocket answers to one raw infer (packed without client-side validation)."""
    async with await WorldClient.connect(url) as c:
        await c.send(msgpack.packb({"endpoint": "infer", "session_id": "v", **fields}, use_bin_type=True,
                                   default=msgpack_numpy.encode))
        reply = await c.receive(60)
    assert isinstance(reply, ErrorReply), reply
    return reply


def test_validation_matches_the_websocket(served, ex00):
    poses = ex00.poses[:12].copy()
    poses[0, :3, :3] *= 2  # not a rotation
    bad_image = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
    cases = [  # (HTTP body changes, the same input as one WebSocket infer, HTTP status)
        ({"poses": poses.tolist(), "intrinsics": ex00.intrinsics[:12].tolist()},
         {"cameras": {"poses": poses, "intrinsics": ex00.intrinsics[:12]}}, 400),
        ({"image": base64.b64encode(bad_image).decode()}, {"image": bad_image}, 400),
        ({"num_frames": 34}, {"num_frames": 34}, 400),
        ({"size": "2000*2000"}, {"size": "2000*2000"}, 413),
    ]
    good_ws = {"image": ex00.image, "prompt": ex00.prompt,
               "cameras": {"poses": ex00.poses[:12], "intrinsics": ex00.intrinsics[:12]}}
    for http_changes, ws_changes, status in cases:
        resp = requests.post(f"{served.http}/v1/videos", json={**body(ex00), **http_changes}, timeout=60)
        expected = asyncio.run(ws_error(served.ws, {**good_ws, **ws_changes}))
        assert resp.status_code == status, resp.text
        assert resp.json() == {"type": "error", "code": expected.code.value, "message": expected.message}


def test_request_errors(served, ex00):
    no_prompt = {k: v for k, v in body(ex00).items() if k != "prompt"}
    resp = requests.post(f"{served.http}/v1/videos", json=no_prompt, timeout=30)
    assert (resp.status_code, resp.json()["code"]) == (400, "missing_field")
    assert "`prompt` is required" in resp.json()["message"]
    resp = requests.post(f"{served.http}/v1/videos", data=b"{not json", headers={"Content-Type": "application/json"},
                         timeout=30)
    assert (resp.status_code, resp.json()["code"]) == (400, "bad_message")
    resp = requests.post(f"{served.http}/v1/videos", json={**body(ex00), "image": "%%%"}, timeout=30)
    assert (resp.status_code, resp.json()["code"]) == (400, "bad_image")
    for path in ("/v1/videos/vid_unknown", "/v1/videos/vid_unknown/content"):
        resp = requests.get(f"{served.http}{path}", timeout=30)
        assert (resp.status_code, resp.json()["code"]) == (404, "not_found")


def test_a_chunked_body_over_the_cap_is_refused_without_reading_it_all(served):
    """No Content-Length: the body is counted as it arrives and refused (413) once past the cap,
    though it never ends; a server that read it whole would never answer."""
    cap = BODY_CAP_MIB * 1024 * 1024
    host, port = served.http.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/videos HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b" " * (256 * 1024)
        for _ in range(cap // len(chunk) + 1):  # one chunk past the cap, and no terminating chunk
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        head = b""
        while b"\r\n\r\n" not in head:
            data = s.recv(65536)
            assert data, f"connection closed without an answer: {head!r}"
            head += data
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_jobs_beyond_the_bound_are_refused(served, ex00):
    """videos.max_jobs 1: while one job runs, the next is refused with busy + Retry-After."""
    running = requests.post(f"{served.http}/v1/videos", params={"async": "true"}, json=body(ex00, frames=81, n=81),
                            timeout=30)
    assert running.status_code == 202, running.text
    refused = requests.post(f"{served.http}/v1/videos", params={"async": "true"}, json=body(ex00), timeout=30)
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "busy" and int(refused.headers["retry-after"]) >= 1
    view = running.json()
    deadline = time.monotonic() + 180
    while view["status"] not in ("succeeded", "failed"):  # leave the app idle for the next tests
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
        view = requests.get(f"{served.http}{view['status_url']}", timeout=10).json()
    assert view["status"] == "succeeded", view
