"""Auth: API keys from the named environment variable (Bearer header, bearer subprotocol or query
parameter), origins (by default the server's own only: issue 54); the per-key quotas and the token bucket."""
from __future__ import annotations

import asyncio
import time

import pytest
import websockets
from starlette.requests import HTTPConnection

from deployments.ingress.guards.auth import Auth, bearer_subprotocol
from deployments.config import AuthArgs
from deployments.errors import Busy
from deployments.ingress.guards.quotas import KeyQuota, TokenBucket
from protocol import decode_reply
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import infer_request

CAMERA_PATH = "/v1/realtime/world/camera"


def conn(headers: dict[str, str] | None = None, query: str = "") -> HTTPConnection:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return HTTPConnection({"type": "websocket", "headers": raw, "query_string": query.encode(), "path": "/"})


def test_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("TEST_LWF_KEYS", " k1 , k2 ")
    auth = Auth(AuthArgs(api_keys_env="TEST_LWF_KEYS"))
    assert auth.authenticate(conn({"Authorization": "Bearer k2"})) == (True, "key1")
    assert auth.authenticate(conn({"Authorization": "bearer  k1"})) == (True, "key0")
    assert auth.authenticate(conn(query="api_key=k1")) == (True, "key0")
    assert auth.authenticate(conn({"Sec-WebSocket-Protocol": "lwf.v1, lwf.bearer.k2"})) == (True, "key1")
    assert not auth.authenticate(conn({"Authorization": "Bearer k3"}))[0]
    assert not auth.authenticate(conn({"Authorization": "k1"}))[0]  # not a bearer token
    assert not auth.authenticate(conn({"Sec-WebSocket-Protocol": "lwf.bearer.k"}))[0]  # a prefix of a key
    assert not auth.authenticate(conn({"Sec-WebSocket-Protocol": "k1"}))[0]  # not the bearer subprotocol
    assert not auth.authenticate(conn())[0]


def test_the_openpi_api_key_scheme_is_accepted_beside_bearer(monkeypatch):
    """openpi's WebsocketClientPolicy(api_key=k) sends `Authorization: Api-Key k`."""
    monkeypatch.setenv("TEST_LWF_KEYS", "k1,k2")
    auth = Auth(AuthArgs(api_keys_env="TEST_LWF_KEYS"))
    assert auth.authenticate(conn({"Authorization": "Api-Key k2"})) == (True, "key1")
    assert auth.authenticate(conn({"Authorization": "api-key k1"})) == (True, "key0")
    assert not auth.authenticate(conn({"Authorization": "Api-Key k3"}))[0]
    assert not auth.authenticate(conn({"Authorization": "Api-Keyk1"}))[0]  # no scheme separator


def test_the_bearer_subprotocol_is_the_one_to_echo():
    assert bearer_subprotocol(conn({"Sec-WebSocket-Protocol": "lwf.v1, lwf.bearer.abc"})) == "lwf.bearer.abc"
    assert bearer_subprotocol(conn({"Sec-WebSocket-Protocol": "lwf.v1"})) is None
    assert bearer_subprotocol(conn()) is None


def test_auth_off_and_a_missing_secret(monkeypatch):
    assert Auth(AuthArgs()).authenticate(conn()) == (True, None)
    monkeypatch.delenv("TEST_LWF_KEYS", raising=False)
    with pytest.raises(ValueError, match="TEST_LWF_KEYS"):
        Auth(AuthArgs(api_keys_env="TEST_LWF_KEYS"))


def test_origins():
    auth = Auth(AuthArgs(allowed_origins=["https://app.example"]))
    assert auth.origin_allowed(conn({"Origin": "https://app.example"}))
    assert not auth.origin_allowed(conn({"Origin": "https://evil.example"}))
    assert auth.origin_allowed(conn())  # non-browser clients send no Origin
    assert Auth(AuthArgs(allowed_origins=["*"])).origin_allowed(conn({"Origin": "https://any.example"}))


def test_by_default_only_the_servers_own_origin_passes():
    """Issue 54 item 6: `allowed_origins` empty meant any origin; it now means the server's own
    (the Origin's host and port are the request's Host), listed ones besides."""
    own = {"Host": "127.0.0.1:8000"}
    default, listed = Auth(AuthArgs()), Auth(AuthArgs(allowed_origins=["http://127.0.0.1:9000"]))
    for auth in (default, listed):
        assert auth.origin_allowed(conn({**own, "Origin": "http://127.0.0.1:8000"}))
        assert auth.origin_allowed(conn(own))  # no Origin: not a browser page
        for foreign in ("https://evil.example", "http://127.0.0.1:8001", "http://localhost:8000", "null",
                        "http://127.0.0.1:8000/path", "file://", "http://user@127.0.0.1:8000"):
            assert not auth.origin_allowed(conn({**own, "Origin": foreign})), foreign
    assert listed.origin_allowed(conn({**own, "Origin": "http://127.0.0.1:9000"}))
    assert not default.origin_allowed(conn({**own, "Origin": "http://127.0.0.1:9000"}))
    # default ports: a page at https://world.example behind a TLS proxy (the server sees http)
    assert default.origin_allowed(conn({"Host": "World.example", "Origin": "https://world.example"}))
    assert default.origin_allowed(conn({"Host": "world.example:443", "Origin": "https://world.example"}))
    assert not default.origin_allowed(conn({"Host": "world.example:8443", "Origin": "https://world.example"}))
    assert default.origin_allowed(conn({"Host": "[::1]:8000", "Origin": "http://[::1]:8000"}))
    assert not default.origin_allowed(conn({"Origin": "http://127.0.0.1:8000"}))  # no Host: nothing is own


def test_allowed_origins_are_checked_and_written_as_browsers_send_them():
    args = AuthArgs(allowed_origins=["HTTPS://App.Example:443", "http://127.0.0.1:9000", "*"])
    assert args.allowed_origins == ["https://app.example", "http://127.0.0.1:9000", "*"]
    for bad in ("http://127.0.0.1:9000/", "app.example", "ws://app.example", "https://app.example/x",
                "https://app.example:99999", ""):
        with pytest.raises(ValueError, match="is not an origin"):
            AuthArgs(allowed_origins=[bad])


def test_token_bucket_refills_at_its_rate():
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert bucket.take() == pytest.approx(0.5)  # one token every 0.5 s
    now[0] = 0.5
    assert bucket.take() == 0.0 and bucket.take() == pytest.approx(0.5)
    now[0] = 100.0  # saved up to the burst only
    assert [bucket.take() for _ in range(4)][-1] == pytest.approx(0.5)


def test_key_quota_caps_chunks_per_minute_and_concurrent_sessions():
    now = [0.0]
    quota = KeyQuota(chunks_per_minute=2, max_sessions=2, clock=lambda: now[0])
    quota.take_chunk()
    quota.take_chunk()
    with pytest.raises(Busy) as e:
        quota.take_chunk()
    assert e.value.retry_after_s == pytest.approx(30.0)  # 2 per minute: the next in 30 s
    now[0] = 30.0
    quota.take_chunk()
    quota.start_session("a")
    quota.start_session("b")
    with pytest.raises(Busy):
        quota.start_session("c")
    quota.start_session("c", replacing="b")  # a connection replacing its own session
    quota.end_session("a")
    quota.start_session("d")
    with pytest.raises(Busy):
        quota.start_session("e")


def test_quotas_need_api_keys():
    with pytest.raises(ValueError, match="api_keys_env"):
        AuthArgs(max_sessions_per_key=1)


# ---- through the strict app (API keys, origins, quotas) ----

def _refused(strict_server, headers: dict | None = None, subprotocols: list[str] | None = None):
    """Connect, read what the server says, then its close."""
    async def go():
        ws = await websockets.connect(strict_server.ws, additional_headers=headers, subprotocols=subprotocols)
        reply = decode_reply(await asyncio.wait_for(ws.recv(), 30))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 30)
        return reply, closed.value.rcvd

    return asyncio.run(go())


def test_no_key_and_a_wrong_key_are_refused(strict_server, api_keys):
    for headers, subprotocols in [(None, None), ({"Authorization": f"Bearer {api_keys[0]}x"}, None),
                                  (None, [f"lwf.bearer.{api_keys[0][:-1]}"])]:
        reply, close = _refused(strict_server, headers, subprotocols)
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.UNAUTHORIZED, reply
        assert close.code == 1008 and close.reason == "unauthorized"


def test_a_key_as_bearer_header_or_browser_subprotocol_is_accepted(strict_connect, api_keys):
    async def go():
        async with strict_connect(api_keys[0]) as c:
            header = c.config
        async with strict_connect(None, subprotocols=["lwf.v1", f"lwf.bearer.{api_keys[1]}"]) as c:
            return header, c.config, c.ws.subprotocol

    header, config, subprotocol = asyncio.run(go())
    assert isinstance(header, CameraServerConfig) and isinstance(config, CameraServerConfig)
    assert subprotocol == f"lwf.bearer.{api_keys[1]}"  # echoed, as browsers require


def test_an_origin_outside_the_allow_list_is_refused_before_the_upgrade(strict_server, strict_connect, api_keys):
    async def go():
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(strict_server.ws, origin="https://evil.example",
                                     additional_headers={"Authorization": f"Bearer {api_keys[0]}"})
        async with strict_connect(api_keys[0], headers={"Origin": "https://app.example"}) as c:
            return refused.value.response.status_code, c.config

    status, config = asyncio.run(go())
    assert status == 403 and isinstance(config, CameraServerConfig)


def test_by_default_a_page_of_another_origin_cannot_open_a_socket(server):
    """Issue 54 item 6: the shared app lists no origins; a page of another site (a browser sends
    its `Origin`) was accepted. Now: 403 before the upgrade, on both WebSocket routes; the
    server's own page (Origin = its Host) and clients without Origin connect."""
    base = server.ws.removesuffix(CAMERA_PATH)

    async def go():
        statuses = []
        for url in (server.ws, base + "/"):  # the camera route and openpi's root route
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url, origin="https://evil.example")
            statuses.append(refused.value.response.status_code)
        configs = []
        for origin in (server.http, None):
            async with websockets.connect(server.ws, origin=origin) as ws:
                configs.append(decode_reply(await asyncio.wait_for(ws.recv(), 30)))
        return statuses, configs

    statuses, configs = asyncio.run(go())
    assert statuses == [403, 403]
    assert all(isinstance(c, CameraServerConfig) for c in configs), configs


def test_another_connection_cannot_read_drive_or_reset_a_session(strict_connect, api_keys, example):
    """Two connections of the same key name the same session id: the second cannot continue,
    reset or read the first's session; its own session under that id is independent."""
    async def go():
        async with strict_connect(api_keys[0]) as owner:
            reference = await owner.run_session("ref", example, chunks=2)
            await owner.reset("ref")
            await owner.infer("mine", example, 0, first=True)
            first = await owner.recv()
            # Connected only now: the strict app closes a socket silent for 2 s after its accept.
            async with strict_connect(api_keys[0]) as other:
                return reference, first, *await _intrude(owner, other, example)

    async def _intrude(owner, other, example):
        await other.infer("mine", example, 1, first=False)  # drive it: no such session here
        drive = await other.recv()
        reset = await other.reset("mine")  # harmless: resets nothing of the owner's
        await owner.infer("mine", example, 1, first=False)
        second = await owner.recv()
        await other.infer("mine", example, 0, first=True)  # its own session under the same id
        own = await other.recv()
        await owner.reset("mine")
        await other.reset("mine")
        return drive, reset, second, own, other.videos

    reference, first, drive, reset, second, own, other_videos = asyncio.run(go())
    assert isinstance(drive, ErrorReply) and drive.code is ErrorCode.MISSING_FIELD, drive
    assert reset.session_id == "mine"
    assert [first.video, second.video] == [r.video for r in reference]  # untouched by the other socket
    assert isinstance(own, FrameReply) and own.chunk_id == 0 and own.debug["dit_replica"]
    assert list(other_videos) == ["mine"] and other_videos["mine"].decode_frames().shape[0] == 9  # its own only


def test_per_key_quotas_answer_busy(strict_server, strict_connect, api_keys, example):
    """8 chunks per minute (refused infers do not count), and at most 2 sessions per key."""
    poses, intrinsics = example.chunk(0)

    async def chunks():
        async with strict_connect(api_keys[1]) as c:
            for _ in range(7):
                await c.send(encode(infer_request("q", poses, intrinsics)))  # no image: missing_field, not counted
            refused = [await c.recv() for _ in range(7)]
            answers, t0 = [], time.monotonic()
            for s in range(10):  # 2 chunks a session (the strict app's cap), until the quota answers
                for k in range(2):
                    await c.infer(f"q{s}", example, k, first=k == 0)
                    answers.append(await c.recv())
                    if isinstance(answers[-1], ErrorReply):
                        return refused, answers, time.monotonic() - t0
                await c.reset(f"q{s}")
            return refused, answers, time.monotonic() - t0

    async def sessions():
        async with strict_connect(api_keys[2]) as a, strict_connect(api_keys[2]) as b, \
                strict_connect(api_keys[2]) as c:
            replies = []
            for client, sid in ((a, "s1"), (b, "s2"), (c, "s3")):  # one after another: which 2 hold the slots is then known
                await client.infer(sid, example, 0, first=True)
                replies.append(await client.recv())
            await a.reset("s1")
            await c.infer("s3", example, 0, first=True)
            replies.append(await c.recv())
            await b.reset("s2")
            await c.reset("s3")
        return replies

    refused, answers, elapsed = asyncio.run(chunks())
    assert all(r.code is ErrorCode.MISSING_FIELD for r in refused)  # refused infers spend no quota
    *served, busy = answers
    assert all(isinstance(r, FrameReply) for r in served), served
    assert busy.code is ErrorCode.BUSY and 0 < busy.retry_after_s <= 7.5, busy
    # the burst of 8, plus one chunk per 7.5 s the bucket refilled while they ran (a slow machine)
    assert 8 <= len(served) <= 8 + int(elapsed / 7.5), (len(served), elapsed)
    s1, s2, s3, s3_again = asyncio.run(sessions())
    assert isinstance(s1, FrameReply) and isinstance(s2, FrameReply)
    assert isinstance(s3, ErrorReply) and s3.code is ErrorCode.BUSY and s3.retry_after_s > 0, s3
    assert isinstance(s3_again, FrameReply)  # s1's reset freed one of the key's 2 sessions
    strict_server.wait_held(0)


def test_the_camera_and_watch_routes_refuse_a_foreign_origin_and_a_wrong_key_alike(strict_server, api_keys):
    """Issue 56 item 6: one admission for every socket route (guards/admission.py). On the strict
    app, a page of another origin gets 403 before the upgrade on the camera and the watch route;
    a wrong key gets the same `unauthorized` error and close (1008 "unauthorized") on both."""
    from world_viewers import watch_url

    async def go():
        statuses, refusals = [], []
        for url in (strict_server.ws, watch_url(strict_server)):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url, origin="https://evil.example",
                                         additional_headers={"Authorization": f"Bearer {api_keys[0]}"})
            statuses.append(refused.value.response.status_code)
            ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {api_keys[0]}x"})
            reply = decode_reply(await asyncio.wait_for(ws.recv(), 30))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 30)
            refusals.append((type(reply), reply.code, reply.message, closed.value.rcvd.code, closed.value.rcvd.reason))
        return statuses, refusals

    statuses, (camera, watch) = asyncio.run(go())
    assert statuses == [403, 403]
    assert camera == watch
    assert camera[:2] == (ErrorReply, ErrorCode.UNAUTHORIZED) and camera[3:] == (1008, "unauthorized")
