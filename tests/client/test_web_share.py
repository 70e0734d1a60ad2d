"""The Share button and the viewer page in a real headless Chromium against the served app
(issue 56 item 8): one page starts a session and shares it, a second page opens the link and
plays the world (frames decoded, the video's time advancing), shows how many watch, and shows
the world's end after Unshare; the token travels in the fragment and the `watch` message, never
in a URL the server sees. Names, prompts and reasons the server sends render as text.
"""
from __future__ import annotations

import re

import msgpack

from protocol.codec import decode, encode
from protocol.messages import ShareRequest, UnshareRequest
from protocol.sharing import WatchRequest, Watching, WorldNotice
from web_support import ARTIFACTS, TIMEOUT_MS, browser, chunks_shown, open_page  # noqa: F401 (the fixture)

MARKUP = '<img src=x onerror="window.__pwned=1"><b>bold</b>'


def _viewer_page(browser, url: str, on_socket=None):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    urls: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: urls.append(r.url))
    if on_socket is not None:
        page.on("websocket", on_socket)
    page.goto(url)
    return page, errors, urls


def test_a_shared_session_plays_on_the_viewer_page_until_unshared(browser, served):
    owner_sent: list[bytes] = []
    page, errors = open_page(browser, served.http + "/",
                             lambda ws: ws.on("framesent", lambda payload: owner_sent.append(payload)))
    page.click("#start")
    chunks_shown(page, 1)
    assert not page.is_disabled("#share")
    page.click("#share")
    page.wait_for_function("document.querySelector('#share-link').value !== ''", timeout=TIMEOUT_MS)
    link = page.input_value("#share-link")
    match = re.fullmatch(re.escape(served.http) + r"/w/([A-Za-z0-9_-]+)#token=([A-Za-z0-9_-]+)", link)
    assert match, link
    world_id, token = match.groups()
    assert page.get_attribute("#connection", "data-state") == "streaming"  # sharing did not stop the stream
    assert page.is_disabled("#share-audience")
    shares = [r for r in map(decode, owner_sent) if isinstance(r, ShareRequest)]
    assert len(shares) == 1 and shares[0].audience == "link" and shares[0].controls == "owner"

    watch_sent: list[bytes] = []
    watch_received: list[bytes] = []
    socket_urls: list[str] = []

    def on_socket(ws) -> None:
        socket_urls.append(ws.url)
        ws.on("framesent", lambda payload: watch_sent.append(payload))
        ws.on("framereceived", lambda payload: watch_received.append(payload))

    viewer, viewer_errors, urls = _viewer_page(browser, link, on_socket)
    viewer.wait_for_selector("#connection[data-state=watching]", timeout=TIMEOUT_MS)
    viewer.wait_for_function("Number(document.querySelector('#stat-chunks').dataset.chunks) >= 2", timeout=TIMEOUT_MS)
    # more than its first chunk played: frames decoded past 12, the video's time past 12 / 16 s
    viewer.wait_for_function("document.querySelector('video').getVideoPlaybackQuality().totalVideoFrames > 12 "
                             "&& document.querySelector('video').currentTime > 0.8", timeout=TIMEOUT_MS)
    assert viewer.text_content("#viewers") == "1 watching"
    # it joined at the world's current chunk (9 / 16 s or later on the owner's clock); it plays from 0
    assert viewer.evaluate("document.querySelector('video').buffered.start(0)") == 0
    assert viewer.text_content("#world") == f"world {world_id}"
    ARTIFACTS.mkdir(exist_ok=True)
    viewer.screenshot(path=str(ARTIFACTS / "web_viewer.png"))

    first = msgpack.unpackb(watch_sent[0], raw=False)
    assert WatchRequest.model_validate(first) == WatchRequest(world_id=world_id, watch_token=token)
    assert socket_urls == [served.ws.replace("/camera", "/watch")]
    assert all(token not in url for url in urls + socket_urls)  # the fragment never left the browser
    replies = [msgpack.unpackb(m, raw=False) for m in watch_received]
    assert Watching.model_validate(replies[0]).world_id == world_id
    frames = [r for r in replies if r["type"] == "frame"]
    assert frames[0]["video"][4:8] == b"ftyp" and all(f["session_id"] == world_id for f in frames)
    assert frames[0]["chunk_id"] == replies[0].get("next_chunk_id")  # the world's current chunk, first

    page.click("#unshare")
    page.wait_for_function("document.querySelector('#share-panel').hidden", timeout=TIMEOUT_MS)
    assert "Unshared" in page.text_content("#status")
    viewer.wait_for_selector("#connection[data-state=ended]", timeout=TIMEOUT_MS)
    assert viewer.text_content("#status").startswith("The world ended")
    assert any(isinstance(r, UnshareRequest) for r in map(decode, owner_sent))
    assert page.get_attribute("#connection", "data-state") == "streaming"  # the owner's session goes on
    page.click("#reset")
    assert errors == [] and viewer_errors == []
    viewer.close()
    page.close()


def test_names_prompts_and_reasons_render_as_text(browser, served):
    """Through a routed watch socket (no server behind it): `watching`, then `world` notices
    whose holder, players, prompt and reason hold markup. The page shows them as text: no
    element is made of them, no handler of theirs runs."""
    got: list[dict] = []

    def route(ws) -> None:
        def on_message(message) -> None:
            got.append(msgpack.unpackb(message, raw=False))
            world = dict(type="world", world_id="wX", viewers=3)
            ws.send(encode(Watching(world_id="wX", viewers=3, controls="owner")))
            ws.send(msgpack.packb({**world, "event": "controls", "holder": MARKUP,
                                   "players": [{"name": "<i>ann</i>"}, "<u>bob</u>"], "prompt": MARKUP}))
            ws.send(encode(WorldNotice(world_id="wX", event="ended", viewers=2, reason=MARKUP)))
        ws.on_message(on_message)

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route_web_socket("**/v1/realtime/world/watch*", route)
    page.goto(served.http + "/w/wX#token=t0k")
    page.wait_for_selector("#connection[data-state=ended]", timeout=TIMEOUT_MS)
    assert got == [{"endpoint": "watch", "world_id": "wX", "watch_token": "t0k"}]
    assert page.text_content("#driver") == f"driven by {MARKUP}"
    assert page.text_content("#players") == "Players: <i>ann</i>, <u>bob</u>"
    assert page.text_content("#world-prompt") == f"Prompt: {MARKUP}"
    assert page.text_content("#status") == f"The world ended: {MARKUP}."
    assert page.text_content("#viewers") == "2 watching"
    assert page.evaluate("document.querySelectorAll('img, b, i, u').length") == 0
    assert page.evaluate("window.__pwned") is None
    assert page.is_hidden("#ask-controls") and page.is_hidden("#fork-here")  # an `owner` world that ended
    assert errors == []
    page.close()


def test_a_link_without_a_token_says_so(browser, served):
    page = browser.new_page()
    page.goto(served.http + "/w/wX")
    page.wait_for_function("document.querySelector('#status').dataset.level === 'error'", timeout=TIMEOUT_MS)
    assert "no token" in page.text_content("#status")
    page.close()


def test_a_refused_share_is_said_and_the_stream_goes_on(browser, served):
    """The server answers in request order: a `share` sent while a chunk is in flight is answered
    after that chunk. Here the route sends it on for another session (the server refuses it, in
    order) and gives the refusal back as the page's: the page says so, and streams on."""
    state: dict = {}

    def route(ws) -> None:
        server = ws.connect_to_server()

        def to_server(message) -> None:
            req = decode(message) if isinstance(message, bytes) else None
            if isinstance(req, ShareRequest):
                state["sid"] = req.session_id
                message = encode(ShareRequest(session_id="someone-else"))
            server.send(message)

        def to_page(message) -> None:
            reply = msgpack.unpackb(message, raw=False) if isinstance(message, bytes) else None
            if isinstance(reply, dict) and reply.get("session_id") == "someone-else":
                state["refused"] = reply["code"]
                message = msgpack.packb({**reply, "session_id": state["sid"], "message": "not shared here"})
            ws.send(message)

        ws.on_message(to_server)
        server.on_message(to_page)

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route_web_socket("**/v1/realtime/world/camera*", route)
    page.goto(served.http + "/")
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    page.click("#start")
    chunks_shown(page, 1)
    page.click("#share")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Cannot share')",
                           timeout=TIMEOUT_MS)
    assert state["refused"] == "bad_message"
    assert page.text_content("#status") == "Cannot share (bad_message): not shared here"
    shown = int(page.get_attribute("#stat-chunks", "data-chunks"))
    chunks_shown(page, shown + 2)  # the stream went on
    assert page.get_attribute("#connection", "data-state") == "streaming"
    assert page.is_hidden("#share-panel") and not page.is_disabled("#share")
    page.click("#reset")
    assert errors == []
    page.close()
