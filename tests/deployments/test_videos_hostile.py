"""`/v1/videos` against hostile clients (issue 31), on the live apps: jobs belong to their
principal, DELETE cancels a job and frees its DiT slot, per-principal quotas and the frame cap,
and bodies that would cost a GB to parse (60 MiB of floats, 200 000 levels deep); cross-site
posts (issue 54): other media types than JSON and other origins start nothing."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import time

import httpx
import numpy as np

MIB = 1024 * 1024
TERMINAL = ("succeeded", "failed")
RSS_MARGIN_MIB = 384  # what 4 bodies of 60 MiB at once may add to the ingress (measured +221; before: ~936 for one)
FLOAT_BODY = b'{"poses": [' + b"0.1234567," * (6 * MIB) + b"0.1]}"  # 60 MiB, 6.3 M floats


def body(traj, frames: int, **extra) -> dict:
    """A video request of `frames` frames from the example (still camera: its first pose)."""
    return {"image": base64.b64encode(traj.image).decode(), "prompt": traj.prompt,
            "poses": np.repeat(traj.poses[:1], frames, 0).tolist(),
            "intrinsics": np.repeat(traj.intrinsics[:1], frames, 0).tolist(),
            "num_frames": frames, "seed": 3, **extra}


def key(k: str) -> dict:
    return {"Authorization": f"Bearer {k}"}


def url(base: str, path: str) -> str:
    """`path` (a job's status_url or content_url: absolute, route prefix included) on `base`'s host."""
    return str(httpx.URL(base).join(path))


def wait_finished(base: str, view: dict, headers: dict, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while view["status"] not in TERMINAL:
        assert time.monotonic() < deadline, view
        time.sleep(0.3)
        resp = httpx.get(url(base, view['status_url']), headers=headers, timeout=10)
        assert resp.status_code == 200, resp.text
        view = resp.json()
    return view


def test_a_job_is_answered_to_its_key_only(strict_server, example, api_keys):
    """Key A's job: with key B every route answers exactly what an unknown id gets (404); with
    no key or a wrong one, 401 whatever the id; key A reads it. (Before: 200 and the MP4 for
    anyone.)"""
    a, b = key(api_keys[-2]), key(api_keys[-1])
    base = strict_server.http
    made = httpx.post(f"{base}/v1/videos", params={"async": "true"}, json=body(example, 21), headers=a, timeout=60)
    assert made.status_code == 202, made.text
    view = made.json()
    job = view["id"]
    for method, path in (("GET", f"/v1/videos/{job}"), ("GET", f"/v1/videos/{job}/content"),
                         ("DELETE", f"/v1/videos/{job}")):
        theirs = httpx.request(method, f"{base}{path}", headers=b, timeout=30)
        unknown = httpx.request(method, f"{base}{path.replace(job, 'vid_' + 'f' * 32)}", headers=b, timeout=30)
        assert theirs.status_code == unknown.status_code == 404, (method, path, theirs.text)
        assert theirs.json()["code"] == unknown.json()["code"] == "not_found"
        assert theirs.json()["message"].replace(job, "ID") == unknown.json()["message"].replace("vid_" + "f" * 32, "ID")
        for headers in ({}, key("wrong")):
            anon = httpx.request(method, f"{base}{path}", headers=headers, timeout=30)
            assert (anon.status_code, anon.json()["code"]) == (401, "unauthorized"), (method, path, anon.text)
    view = wait_finished(base, view, a)
    assert view["status"] == "succeeded", view
    content = httpx.get(url(base, view['content_url']), headers=a, timeout=30)
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    assert httpx.get(url(base, view['content_url']), headers=b, timeout=30).status_code == 404


def test_without_auth_a_job_belongs_to_its_client_address(server, example):
    """No auth: a job made from 127.0.0.1 is 404 from 127.0.0.2 (another client address)."""
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
    made = httpx.post(f"{server.http}/v1/videos", params={"async": "true"}, json=body(example, 9), timeout=60)
    assert made.status_code == 202, made.text
    view = made.json()
    with other:
        for method, path in (("GET", view["status_url"]), ("GET", view["content_url"]), ("DELETE", view["status_url"])):
            resp = other.request(method, f"{server.http}{path}")
            assert (resp.status_code, resp.json()["code"]) == (404, "not_found"), (method, path, resp.text)
    assert wait_finished(server.http, view, {})["status"] == "succeeded"
    assert httpx.delete(f"{server.http}{view['status_url']}", timeout=30).json()["status"] == "succeeded"
    assert httpx.get(f"{server.http}{view['status_url']}", timeout=30).status_code == 404  # dropped


def test_delete_cancels_a_job_and_frees_its_slot_and_quotas_bound_a_client(server, example):
    """Two long anonymous jobs (481 frames, the cap) hold two DiT slots; a third is refused
    (videos.max_jobs_per_principal 2); DELETE cancels each, its slot is released, and a new
    job is accepted again; a job over the frame cap (4089 frames: its 4089 poses, or only
    the frame count) is refused naming the cap."""
    base = server.http
    server.wait_held(0)
    jobs = []
    for _ in range(2):
        made = httpx.post(f"{base}/v1/videos", params={"async": "true"}, json=body(example, 481), timeout=60)
        assert made.status_code == 202, made.text
        jobs.append(made.json())
    try:
        third = httpx.post(f"{base}/v1/videos", params={"async": "true"}, json=body(example, 9), timeout=60)
        assert (third.status_code, third.json()["code"]) == (503, "busy"), third.text
        assert "videos.max_jobs_per_principal" in third.json()["message"] and int(third.headers["retry-after"]) >= 1
        sync = httpx.post(f"{base}/v1/videos", json=body(example, 9), timeout=60)  # a sync video counts too
        assert (sync.status_code, sync.json()["code"]) == (503, "busy"), sync.text
        server.wait_held(2, timeout=60)
        for job in jobs:
            view = httpx.get(f"{base}{job['status_url']}", timeout=10).json()
            assert view["status"] == "running" and view["chunks_done"] < view["chunks_total"], view
    finally:
        gone = [httpx.delete(f"{base}{job['status_url']}", timeout=30) for job in jobs]
    assert [(g.status_code, g.json()["status"]) for g in gone] == [(200, "cancelled")] * 2, [g.text for g in gone]
    server.wait_held(0, timeout=30)
    assert httpx.get(f"{base}{jobs[0]['status_url']}", timeout=10).status_code == 404
    for over_cap in (body(example, 4089), {**body(example, 9), "num_frames": 4089}):
        over = httpx.post(f"{base}/v1/videos", params={"async": "true"}, json=over_cap, timeout=60)
        assert (over.status_code, over.json()["code"]) == (413, "too_large"), over.text
        assert "481 frames (videos.max_frames)" in over.json()["message"], over.text
    again = httpx.post(f"{base}/v1/videos", params={"async": "true"}, json=body(example, 9), timeout=60)
    assert again.status_code == 202, again.text
    assert wait_finished(base, again.json(), {})["status"] == "succeeded"
    httpx.delete(f"{base}{again.json()['status_url']}", timeout=30)


# ---- bodies that cost memory or CPU to parse ----

def _ingress_pid() -> int:
    """The pid of the `lwf` app's WorldIngress replica of this run (a child of our raylet: other
    runs on the machine have their own)."""
    import ray

    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == raylet and title.startswith("ray::ServeReplica:lwf:WorldIngress"):
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_huge_and_deep_bodies_are_refused_at_a_bounded_cost(server):
    """Four 60 MiB bodies of floats at once (under the 64 MiB byte cap): those within the
    replica's body budget get `too_large` after the token budget, the others `busy`; the
    ingress adds far less than the ~1 GB one body cost json.loads before, and
    /healthz keeps answering meanwhile; a body 200 000 levels deep gets `bad_message` (400,
    not 500)."""
    pid = _ingress_pid()
    baseline = _rss(pid)

    async def go() -> tuple[list[httpx.Response], list[int], int]:
        peak = baseline
        health: list[int] = []
        done = asyncio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss(pid))
                await asyncio.sleep(0.05)

        async def poll(client: httpx.AsyncClient) -> None:
            while not done.is_set():
                health.append((await client.get(f"{server.http}/healthz", timeout=10)).status_code)
                await asyncio.sleep(0.2)

        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.create_task(sample()), asyncio.create_task(poll(client))]
            posts = await asyncio.gather(*(client.post(f"{server.http}/v1/videos", content=FLOAT_BODY,
                                                       headers={"content-type": "application/json"})
                                           for _ in range(4)))
            done.set()
            await asyncio.gather(*tasks)
        return posts, health, peak

    posts, health, peak = asyncio.run(go())
    codes = sorted((r.status_code, r.json()["code"]) for r in posts)
    # two bodies of ~60 MiB fit the replica's body budget (2 x videos.max_body_mib), the others get busy
    assert (413, "too_large") in codes and set(codes) <= {(413, "too_large"), (503, "busy")}, codes
    for resp in posts:
        if resp.status_code == 413:
            assert "JSON tokens" in resp.json()["message"] and "(videos.max_frames)" in resp.json()["message"]
    grown_mib = (peak - baseline) / MIB
    print(f"RELIABILITY videos 4 x 60 MiB float bodies: {codes}, ingress peak +{grown_mib:.0f} MiB, "
          f"healthz {len(health)} polls all 200: {set(health) == {200}}")
    assert grown_mib < RSS_MARGIN_MIB, grown_mib
    assert health and set(health) == {200}, health

    deep = httpx.post(f"{server.http}/v1/videos", content=b"[" * 200_000 + b"]" * 200_000, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert (deep.status_code, deep.json()["code"]) == (400, "bad_message"), deep.text[:300]


def test_openapi_documents_the_video_body_and_delete(strict_server):
    spec = httpx.get(f"{strict_server.http}/openapi.json", headers=strict_server.headers, timeout=30).json()
    post = spec["paths"]["/v1/videos"]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema["title"] == "VideoRequest" and set(schema["required"]) == {"image", "prompt", "poses", "intrinsics"}
    assert {"num_frames", "seed", "size", "intrinsics_resolution"} <= set(schema["properties"])
    assert "delete" in spec["paths"]["/v1/videos/{job_id}"]


NO_PREFLIGHT = ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x")  # what a page of any site may POST without asking


def test_a_cross_site_post_starts_no_job(server, example):
    """Issue 54 item 6: a page of another site may POST `text/plain` (or a form) to a server on
    its visitor's machine without a CORS preflight, and the body was parsed as JSON: 202, a job.
    Now every type but `application/json` (charset utf-8, if any) is 415 before the body is
    read, and a page of another origin gets 403 on every route whatever it sends."""
    base, raw = server.http, json.dumps(body(example, 9)).encode()
    server.wait_held(0)
    for content_type in (*NO_PREFLIGHT, None, "application/json; charset=latin-1", "application/jsonx"):
        headers = {} if content_type is None else {"Content-Type": content_type}
        resp = httpx.post(f"{base}/v1/videos", params={"async": "true"}, content=raw, headers=headers, timeout=60)
        assert (resp.status_code, resp.json()["code"]) == (415, "unsupported_media_type"), (content_type, resp.text)
        assert "`Content-Type: application/json`" in resp.json()["message"]
    foreign = {"Origin": "https://evil.example"}
    made = httpx.post(f"{base}/v1/videos", params={"async": "true"}, content=raw, timeout=60,
                      headers={**foreign, "Content-Type": "application/json"})
    assert (made.status_code, made.json()["code"]) == (403, "forbidden"), made.text
    server.wait_held(0, timeout=5)  # nothing started
    own = {"Origin": base, "Content-Type": "application/json; charset=UTF-8"}  # the server's own page
    made = httpx.post(f"{base}/v1/videos", params={"async": "true"}, content=raw, headers=own, timeout=60)
    assert made.status_code == 202, made.text
    gone = httpx.delete(url(base, made.json()["status_url"]), headers=foreign, timeout=30)
    assert (gone.status_code, gone.json()["code"]) == (403, "forbidden")
    assert httpx.delete(url(base, made.json()["status_url"]), timeout=30).status_code == 200
    server.wait_held(0)
