"""The web page in a real headless Chromium against the served app.

The page loads from the ingress, says on the video that it serves random weights, offers only
the sizes the handshake allows and says what to do after an error, shows a HUD (frames/s, chunk
interval, control lag, the chunk being made) and moves the camera from touch pads at 390x844.
It streams a session through Media Source Extensions (the video element plays past 30 frames),
drives the camera with `control` + `from_keys` infers (checked on the WebSocket frames it sent
and received, decoded with the server's own codec), shows the control lag, undoes the last
chunk (`rewind`), plays at the rate chunks arrive when they come slower than 16 fps, resets,
resumes a dropped socket, degrades with a message when the server is busy or a resume is
refused, and says which chunks came from the prefix store. Screenshots go to artifacts/.
"""
from __future__ import annotations

import re
import threading

import msgpack
import numpy as np
import pytest

from protocol.codec import decode, decode_reply, encode
from protocol.errors import ErrorCode
from protocol.messages import (ControlRequest, ErrorReply, FrameReply, InferRequest, ResetRequest, ResumeRequest,
                               RewindRequest, Rewound)
from web_support import ARTIFACTS, TIMEOUT_MS, browser, chunks_shown, open_page  # noqa: F401 (the fixture)


def test_live_session_plays_and_follows_the_keyboard(browser, served):
    sent: list[bytes] = []
    received: list[bytes] = []

    def on_socket(ws) -> None:
        ws.on("framesent", lambda payload: sent.append(payload))
        ws.on("framereceived", lambda payload: received.append(payload))

    page, errors = open_page(browser, served.http + "/", on_socket)
    assert "Connected to tiny" in page.text_content("#status")

    page.click("#start")
    chunks_shown(page, 1)
    assert page.is_disabled("#start")  # a session runs: Start is off, and looks it (issue 36)
    assert page.evaluate("getComputedStyle(document.querySelector('#start')).backgroundColor") == \
        "rgb(58, 63, 72)"  # style.css `button:disabled`
    page.keyboard.down("KeyW")  # walk forward while the next chunks are requested
    chunks_shown(page, 3)
    page.keyboard.up("KeyW")
    page.wait_for_function("document.querySelector('video').currentTime > 30 / 16", timeout=TIMEOUT_MS)
    quality = page.evaluate("document.querySelector('video').getVideoPlaybackQuality().totalVideoFrames")
    assert quality > 30
    assert page.get_attribute("#connection", "data-state") == "streaming"
    assert page.text_content("#stat-ttfc").endswith("ms")
    page_lag = page.text_content("#stat-lag")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_client.png"))
    page.click("#reset")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Session reset')",
                           timeout=TIMEOUT_MS)
    assert not page.is_disabled("#start")
    assert errors == []

    requests_ = [decode(m) for m in sent]  # the server's intake: every frame is a valid request
    infers = [r for r in requests_ if isinstance(r, InferRequest)]
    assert isinstance(requests_[-1], ResetRequest) and requests_[-1].session_id == infers[0].session_id
    first = infers[0]
    assert first.image[:8] == b"\x89PNG\r\n\x1a\n" and first.prompt and first.translation_scale > 0
    assert [r.client_chunk_id for r in infers] == list(range(len(infers))) and len(infers) >= 3
    assert all(r.from_keys and r.cameras is None for r in infers)  # the server moves the camera
    controls = [r for r in requests_ if isinstance(r, ControlRequest)]
    assert [c.keys for c in controls[:3]] == [(), ("w",), ()]  # none at the start, W down, W up
    assert [c.event_id for c in controls] == list(range(1, len(controls) + 1))
    assert {c.session_id for c in controls} == {first.session_id}
    frames = [r for r in map(decode_reply, received) if isinstance(r, FrameReply)]
    assert [f.chunk_id for f in frames[:3]] == [0, 1, 2] and [f.num_frames for f in frames[:3]] == [9, 12, 12]
    assert frames[0].event_id == 1 and all(f.event_id is not None for f in frames)
    z = np.stack([f.poses[:, 2, 3] for f in frames])  # forward position of every pose [chunks, 12]
    np.testing.assert_array_equal(z[0], 0.0)  # no key held yet: the camera stands still
    walked = [f for f in frames if f.event_id == 2]  # the chunks made while W was held
    assert walked and all(np.diff(f.poses[:, 2, 3]).min() > 0.04 for f in walked)  # W walks forward along +z
    assert (np.diff(z.ravel()) >= -1e-6).all()
    lag = page_lag  # the stats panel's control lag, read before the reset
    assert re.match(r"\d+ ms \(p50 \d+ ms; key state \d+\)", lag), lag
    page.close()


def _routed_page(browser, served, route):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route_web_socket("**/v1/realtime/world/camera*", route)
    page.goto(served.http + "/")
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    return page, errors


def _dropping_route(state: dict, drop_after: int, intercept):
    """A route passing frames both ways: `intercept(ws, request)` may answer a request itself
    (True: not forwarded); after the `drop_after`-th frame reply both ends are closed."""
    state.setdefault("frames", 0)
    state.setdefault("sockets", 0)

    def route(ws) -> None:
        server = ws.connect_to_server()
        state["sockets"] += 1

        def to_server(message) -> None:
            req = decode(message) if isinstance(message, bytes) else None
            if req is None or not intercept(ws, req):
                server.send(message)

        def to_page(message) -> None:
            ws.send(message)
            if isinstance(decode_reply(message), FrameReply):
                state["frames"] += 1
                if state["frames"] == drop_after:
                    ws.close(code=4000, reason="server going away")
                    server.close()

        ws.on_message(to_server)
        server.on_message(to_page)

    return route


def test_busy_then_a_dropped_socket_is_resumed(browser, served):
    """Through a routed socket: the first infer is answered `busy` (the page retries after
    retry_after_s), then the socket drops (both ends) after the second frame: the page
    reconnects, sends `resume` with the 2 frames it has, and streams on from chunk 2."""
    state = {"busy_sent": False, "resumes": []}

    def intercept(ws, req) -> bool:
        if isinstance(req, InferRequest) and req.image is not None and not state["busy_sent"]:
            state["busy_sent"] = True
            ws.send(encode(ErrorReply(code=ErrorCode.BUSY, session_id=req.session_id, retry_after_s=0.5,
                                      message="all 2 session slots of this replica are taken")))
            return True
        if isinstance(req, ResumeRequest):
            state["resumes"].append(req)
        return False

    route = _dropping_route(state, 2, intercept)
    page, errors = _routed_page(browser, served, route)
    page.click("#start")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Server busy')",
                           timeout=TIMEOUT_MS)
    page.wait_for_selector("#errors li[data-code=busy]", state="attached", timeout=TIMEOUT_MS)  # in the folded panel
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Resumed the session')",
                           timeout=TIMEOUT_MS)
    resumed = re.match(r"Resumed the session at chunk (\d+) \((\d+) sent again\)", page.text_content("#status"))
    assert resumed and int(resumed[1]) == 2 + int(resumed[2])  # the chunk in flight at the drop, if any, came again
    chunks_shown(page, 4)  # streaming on the new socket
    assert page.get_attribute("#connection", "data-state") == "streaming"
    assert state["sockets"] >= 2 and state["resumes"] and state["resumes"][-1].resume_from == 2
    assert "[busy] all 2 session slots of this replica are taken" in page.text_content("#errors li[data-code=busy]")
    page.click("#reset")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Session reset')",
                           timeout=TIMEOUT_MS)
    assert errors == []
    page.close()


def test_a_drop_that_cannot_be_resumed_shows_why(browser, served):
    """The socket drops after the first frame and the resume is refused (`session_lost`, as
    after the grace period): the page says so, stops, and Start is enabled again."""
    def intercept(ws, req) -> bool:
        if isinstance(req, ResumeRequest):
            ws.send(encode(ErrorReply(code=ErrorCode.SESSION_LOST, session_id=req.session_id,
                                      message="the session's grace period ended")))
            return True
        return False

    route = _dropping_route({}, 1, intercept)
    page, _ = _routed_page(browser, served, route)
    page.click("#start")
    page.wait_for_function("document.querySelector('#status').textContent.includes('could not be resumed')",
                           timeout=TIMEOUT_MS)
    status = page.text_content("#status")
    assert "[session_lost] the session's grace period ended" in status and "Press Start to begin again" in status
    assert page.text_content("#overlay") == status  # shown on the video, not a blank page
    assert page.get_attribute("#connection", "data-state") == "stopped"
    assert page.evaluate("document.querySelector('video').readyState") >= 2  # the played video stays
    assert not page.is_disabled("#start")
    page.close()


MSGPACK_VALUE = {  # every size class of the types the page sends and receives
    "fix": 7, "u8": 200, "u16": 65535, "u32": 2**32 - 1, "u64": 2**40, "nfix": -5, "i8": -100, "i16": -32768,
    "i32": -(2**31), "i64": -(2**40), "f": 0.1, "t": True, "n": None, "s5": "hello", "s8": "x" * 40,
    "s16": "é" * 200, "a16": list(range(20)), "nested": {"poses": [[1.5, 0, -2.25]], "ok": False},
}


def test_js_msgpack_matches_python(browser, served):
    page, _ = open_page(browser, served.http + "/")
    encoded = page.evaluate("""async (value) => {
        const m = await import('./static/msgpack.js');
        value.bin = new Uint8Array(70000).map((_, i) => i % 251);
        return Array.from(m.encode(value));
    }""", MSGPACK_VALUE)
    expected = {**MSGPACK_VALUE, "bin": bytes(i % 251 for i in range(70000))}
    assert bytes(encoded) == msgpack.packb(expected, use_bin_type=True)

    packed = msgpack.packb({**expected, "f32": 0.5}, use_bin_type=True, use_single_float=True)
    decoded = page.evaluate("""async (bytes) => {
        const m = await import('./static/msgpack.js');
        const v = m.decode(new Uint8Array(bytes));
        v.bin = Array.from(v.bin);
        return v;
    }""", list(packed))
    assert bytes(decoded.pop("bin")) == expected.pop("bin")
    assert decoded.pop("f32") == 0.5 and decoded.pop("f") == pytest.approx(0.1)  # sent as float32 here
    assert decoded == {k: v for k, v in expected.items() if k != "f"}
    page.close()


def test_a_page_left_idle_past_the_handshake_deadline_still_starts(browser, served):
    """The server closes a socket that sends nothing within connection.first_message_timeout_s
    (5 s): the page's boot socket, opened to read the handshake, is dropped quietly, and Start
    opens a new one (before: 'connection lost … press Start to reconnect' and state disconnected)."""
    from deployments.config import ConnectionArgs
    page, errors = open_page(browser, served.http + "/")
    page.wait_for_timeout(1000 * (ConnectionArgs().first_message_timeout_s + 2))
    assert page.get_attribute("#connection", "data-state") == "idle"
    assert "Connected to tiny" in page.text_content("#status")
    page.click("#start")
    chunks_shown(page, 1)
    assert errors == []
    page.close()


def test_undo_takes_the_last_chunk_back(browser, served):
    """Undo after 3 chunks: the page waits for the chunk in flight, sends `rewind` to the last
    chunk it had when Undo was pressed, drops it from the player, and the stream goes on from there."""
    sent: list[bytes] = []
    received: list[bytes] = []

    def on_socket(ws) -> None:
        ws.on("framesent", lambda payload: sent.append(payload))
        ws.on("framereceived", lambda payload: received.append(payload))

    page, errors = open_page(browser, served.http + "/", on_socket)
    assert page.is_disabled("#undo")
    page.click("#start")
    chunks_shown(page, 3)
    page.wait_for_selector("#undo:not([disabled])", timeout=TIMEOUT_MS)
    before = int(page.get_attribute("#stat-chunks", "data-chunks"))
    page.click("#undo")
    page.wait_for_function("document.querySelector('#status').textContent.includes('taken back')",
                           timeout=TIMEOUT_MS)
    rewinds = [r for r in map(decode, sent) if isinstance(r, RewindRequest)]
    assert len(rewinds) == 1 and before - 1 <= rewinds[0].to_chunk <= before  # the last it had (a chunk may land meanwhile)
    k = rewinds[0].to_chunk
    status = page.text_content("#status")
    assert status.startswith(f"Chunk {k} taken back")
    chunks_shown(page, k + 2)  # the stream goes on: chunk k again, then k + 1
    replies = [r for r in map(decode_reply, received) if isinstance(r, (FrameReply, Rewound))]
    at = next(i for i, r in enumerate(replies) if isinstance(r, Rewound))
    assert replies[at].next_chunk_id == k
    assert [r.chunk_id for r in replies[at + 1:at + 3]] == [k, k + 1]  # chunk k made again
    page.wait_for_function(f"document.querySelector('video').currentTime > {(9 + 12 * k) / 16}", timeout=TIMEOUT_MS)
    page.click("#reset")
    assert errors == []
    page.close()


def mark_cached(chunk_ids: set[int]):
    """A WebSocket route handler: the server's frame replies of `chunk_ids` reach the page with
    `cached: true`, as the prefix store sends them (the tests' app keeps no store)."""
    def route(ws) -> None:
        server = ws.connect_to_server()

        def to_page(message) -> None:
            if isinstance(message, bytes):
                msg = msgpack.unpackb(message, raw=False, strict_map_key=False)
                if isinstance(msg, dict) and msg.get("type") == "frame" and msg.get("chunk_id") in chunk_ids:
                    message = msgpack.packb({**msg, "cached": True}, use_bin_type=True)
            ws.send(message)

        server.on_message(to_page)

    return route


def test_chunks_from_the_prefix_store_are_said_so(browser, served):
    """A chunk the server's prefix store sent (`cached`: an earlier session with the same inputs
    made it, in no time) is counted and said, not shown with its stage times as if computed."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route_web_socket(re.compile(r".*/v1/realtime/world/camera.*"), mark_cached({0}))
    page.goto(served.http + "/")
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    page.click("#start")
    chunks_shown(page, 1)
    assert page.get_attribute("#stat-chunks", "data-cached") == "1"
    assert page.text_content("#stat-chunks").endswith("(1 from the server's prefix store)")
    if page.get_attribute("#stat-chunks", "data-chunks") == "1":  # chunk 1 not shown yet: the stages are chunk 0's
        assert page.text_content("#stat-stages").startswith("from the server's prefix store")
    chunks_shown(page, 2)  # chunk 1, computed: its stage times again
    page.wait_for_function("!document.querySelector('#stat-stages').textContent.includes('prefix store')",
                           timeout=TIMEOUT_MS)
    assert "dit " in page.text_content("#stat-stages")
    assert page.get_attribute("#stat-chunks", "data-cached") == "1"
    page.click("#reset")
    assert errors == []
    page.close()


SLOW_SOCKET = """(() => {
  // Every message the page's socket receives is handed to it DELAY ms after the previous one:
  // a server that makes a 12-frame chunk in about 2 s (6 fps, below half real time).
  const DELAY = 2000;
  const desc = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage");
  Object.defineProperty(WebSocket.prototype, "onmessage", {
    set(fn) {
      let chain = Promise.resolve();
      desc.set.call(this, (ev) => {
        chain = chain.then(() => new Promise((r) => setTimeout(r, DELAY))).then(() => fn(ev));
      });
    },
    get() { return desc.get.call(this); },
  });
})();"""


def test_slow_generation_plays_at_the_rate_chunks_arrive(browser, served):
    """Chunks slower than 16 fps: the video slows to the arrival rate (said in the stats panel)
    instead of playing 12 frames at 16 fps and freezing until the next chunk."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.add_init_script(SLOW_SOCKET)
    page.goto(served.http + "/")
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    page.click("#start")
    chunks_shown(page, 4)
    # the longest time the playhead stood still over 5 s of playback (sampled every 100 ms)
    longest_still = page.evaluate("""async () => {
        const v = document.querySelector('video');
        let last = v.currentTime, since = performance.now(), longest = 0;
        const end = performance.now() + 5000;
        while (performance.now() < end) {
            await new Promise((r) => setTimeout(r, 100));
            const now = performance.now();
            if (v.currentTime !== last) { last = v.currentTime; since = now; }
            longest = Math.max(longest, now - since);
        }
        return longest;
    }""")
    rate = float(page.get_attribute("#stat-playback", "data-rate"))
    text = page.text_content("#stat-playback")
    assert longest_still < 600, f"the video stood still for {longest_still:.0f} ms"  # at 16 fps: ~1.2 s a chunk
    assert rate < 0.9, text  # slowed down: chunks come at about half real time
    assert re.match(r"0\.\d\d× \(playing \d+\.\d fps; arriving \d+\.\d fps\)", text), text
    page.click("#reset")
    assert errors == []
    page.close()


def test_the_playback_rate_follows_generation_not_pacing(browser, served):
    """web/playback.js alone: 1x while chunks come at 16 fps or more (whatever the buffer), the
    generation rate over 16 steered by the buffer below it, within [half, 1.5] x the target."""
    page, _ = open_page(browser, served.http + "/")
    rates = page.evaluate("""async () => {
        const { RatePacer } = await import('./static/playback.js');
        const p = new RatePacer();
        const out = { none: p.update(0.1) };
        p.arrived(12, 0.3); p.arrived(12, 0.4);  // 34 fps: faster than real time
        out.fast_low = p.update(0.05); out.fast_high = p.update(3);
        p.reset();
        for (let i = 0; i < 5; i++) p.arrived(12, 1.5);  // 8 fps: half real time
        out.slow_one_chunk = p.update(0.75); out.slow_low = p.update(0.1); out.slow_high = p.update(5);
        out.text = p.describe();
        return out;
    }""")
    assert rates["none"] == 1 and rates["fast_low"] == 1 and rates["fast_high"] == 1
    assert rates["slow_one_chunk"] == pytest.approx(0.5)
    assert rates["slow_low"] == pytest.approx(0.25) and rates["slow_high"] == pytest.approx(0.75)
    assert rates["text"] == "0.75× (playing 12.0 fps; arriving 8.0 fps)"
    page.close()


# ---- the page explains itself (issue 48): screenshots in artifacts/ ----

def explained_page(browser, url: str, on_socket=None, **context):
    """A page in its own context (viewport, touch), with its script errors and console errors."""
    ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 800}, **context})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    if on_socket is not None:
        page.on("websocket", on_socket)
    page.goto(url)
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    return page, errors


def recording():
    sent: list[bytes] = []
    received: list[bytes] = []

    def on_socket(ws) -> None:
        ws.on("framesent", lambda payload: sent.append(payload))
        ws.on("framereceived", lambda payload: received.append(payload))

    return sent, received, on_socket


def handshake(received: list[bytes]):
    from protocol.messages import CameraServerConfig
    return next(r for r in map(decode_reply, received) if isinstance(r, CameraServerConfig))


def offered_sizes(page) -> list[str]:
    return page.eval_on_selector_all("#size option", "os => os.map((o) => o.value)")


def test_the_random_weights_notice_and_the_hud(browser, served):
    """1280x800: the video says it is noise from random weights (the handshake says so), the
    sizes offered are within the server's area limit, Start shows a progress bar until the first
    frame, and after 3 chunks with a key pressed the HUD on the video shows frames/s, the chunk
    interval, the control lag and the queue; the lag hint says when a key shows; details folded."""
    sent, received, on_socket = recording()
    page, errors = explained_page(browser, served.http + "/", on_socket)
    config = handshake(received)
    assert config.random_weights is True and config.checkpoint is None
    assert page.is_visible("#notice")
    notice = page.text_content("#notice")
    assert "Demo model with random weights:" in notice and "the video is coloured noise that follows the camera" in notice
    assert page.text_content("#weights-link") == "How to load the released weights"
    assert page.text_content("#model") == "tiny · random weights"
    sizes = offered_sizes(page)
    assert sizes[0] == "" and len(sizes) > 1  # the server's default first
    assert all(int(h) * int(w) <= config.max_output_area for h, w in (s.split("*") for s in sizes[1:]))
    default = page.text_content("#size option[value='']")  # what will stream (issue 57: not the 16:9 size)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_random_weights_notice.png"))

    page.click("#start")
    page.wait_for_selector("#progress:not([hidden])", timeout=TIMEOUT_MS)
    assert page.text_content("#progress-text").startswith("Making the first chunk")
    chunks_shown(page, 1)
    assert page.is_hidden("#progress")
    first = next(r for r in map(decode_reply, received) if isinstance(r, FrameReply))
    h, w = first.resolution
    assert default == f"server default ({h}×{w})", (default, first.resolution)
    page.keyboard.down("KeyD")
    chunks_shown(page, 3)
    page.keyboard.up("KeyD")
    page.wait_for_selector("#hud-lag[data-measured=true]", timeout=TIMEOUT_MS)
    chunks_shown(page, 3)
    assert page.is_visible("#hud") and page.is_visible("#notice")
    assert re.fullmatch(r"\d+\.\d fps generated", page.text_content("#hud-fps"))
    assert re.fullmatch(r"chunk every \d+(\.\d)? s", page.text_content("#hud-interval"))
    assert re.fullmatch(r"control lag \d+(\.\d)? s", page.text_content("#hud-lag"))
    assert re.fullmatch(r"(generating chunk \d+ · )?\d+\.\d s buffered", page.text_content("#hud-work"))
    assert re.fullmatch(r"A key shows in about \d+(\.\d)? s here\.", page.text_content("#lag-hint"))
    assert page.get_attribute("#details", "open") is None and not page.is_visible("#stat-lag")  # folded
    page.screenshot(path=str(ARTIFACTS / "web_hud_after_3_chunks.png"))
    page.click("#details summary")
    assert re.match(r"\d+ ms \(p50 \d+ ms; key state \d+\)", page.text_content("#stat-lag"))
    assert re.fullmatch(r"\d+\.\d fps generated \(last chunk; realtime is 16\)", page.text_content("#stat-fps"))
    key = page.text_content("#rates-key")  # the three rates on the page, each explained
    assert all(f"{name}, " in key for name in ("generated", "arriving", "playing"))
    page.click("#reset")
    controls = [r for r in map(decode, sent) if isinstance(r, ControlRequest)]
    assert ("d",) in [c.keys for c in controls]
    assert errors == []
    page.context.close()


def test_the_size_list_says_what_streams_as_the_server_decides_it(browser, served):
    """web/sizes.js's outputSize against the server's own rule (SizeRule.output: spec B.1, then the
    nearest bucket) for sizes, image aspects and bucket sets; the issue's case: the tiny model's
    default 128*224 streams the page's 832x480 image at 128x208, not the 16:9 image's 112x224.
    And the hint after `unauthorized` names the field the page takes a key in."""
    from deployments.ingress.sizes import SizeRule

    page, errors = open_page(browser, served.http + "/")
    cases = [(size, h0, w0, buckets) for size in ("128*224", "32*64", "256*448", "480*832", "720*1280")
             for h0, w0 in ((480, 832), (9, 16), (1080, 1920), (600, 800), (1000, 700), (333, 1000))
             for buckets in ((), ((464, 832), (480, 480), (832, 464), (256, 448)))]
    got = page.evaluate("""async (cases) => {
        const { outputSize } = await import('./static/sizes.js');
        return cases.map(([size, h0, w0, buckets]) => outputSize(size, h0, w0, { size_buckets: buckets }));
    }""", [[s, h0, w0, [list(b) for b in bk]] for s, h0, w0, bk in cases])
    want = [list(SizeRule(bk, 10**7).output(int(s.split("*")[0]) * int(s.split("*")[1]), h0, w0))
            for s, h0, w0, bk in cases]
    assert got == want
    assert got[0] == [128, 208] and got[2] == [112, 224]  # 832x480 and a 16:9 image at 128*224
    hint = page.evaluate("async () => (await import('./static/sizes.js')).nextStep('unauthorized', null)")
    assert "API key field" in hint and "Settings" not in hint
    assert page.text_content("label:has(#api-key)").strip() == "API key"
    assert errors == []
    page.close()


def test_a_size_the_server_refuses_says_which_it_accepts(browser, served):
    """A link asking for a size over the server's area: `too_large` is shown on the video with
    the sizes this server accepts, nothing stays counted in flight, and Start works again."""
    sent, received, on_socket = recording()
    page, errors = explained_page(browser, served.http + "/?size=1088*1920", on_socket)
    config = handshake(received)
    assert 1088 * 1920 > config.max_output_area
    assert page.input_value("#size") == "1088*1920"
    assert page.text_content("#size option:checked") == "1088×1920 (from the link)"
    page.click("#start")
    page.wait_for_selector("#overlay[data-level=error]", timeout=TIMEOUT_MS)
    overlay = page.text_content("#overlay")
    accepted = ", ".join(s.replace("*", "×") for s in offered_sizes(page)[1:-1])
    assert overlay.startswith("Error (too_large): ")
    assert overlay.endswith(f"Pick a smaller size (at most {config.max_output_area} pixels here): {accepted}, "
                            "then press Start.")
    assert page.text_content("#stat-queue").startswith("0 in flight")
    assert page.get_attribute("#connection", "data-state") == "stopped" and not page.is_disabled("#start")
    page.screenshot(path=str(ARTIFACTS / "web_size_error.png"))
    page.select_option("#size", "")  # the server's default: accepted
    page.click("#start")
    chunks_shown(page, 1)
    page.click("#reset")
    infers = [m for m in (msgpack.unpackb(b, raw=False) for b in sent) if m.get("endpoint") == "infer"]
    assert infers[0]["size"] == "1088*1920" and infers[-1].get("size") is None  # (the codec refuses the first)
    assert errors == []
    page.context.close()


def test_on_a_phone_start_is_in_view_and_the_pad_moves_the_camera(browser, served):
    """390x844 with touch: Start is on screen without scrolling, the pads show, and a tap on
    the forward pad sends `control` ["w"]: the chunk made with it walks forward."""
    sent, received, on_socket = recording()
    page, errors = explained_page(browser, served.http + "/", on_socket, viewport={"width": 390, "height": 844},
                                  has_touch=True, is_mobile=True)
    box = page.locator("#start").bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 844
    assert page.is_visible("#pads [data-code=KeyW]") and page.is_visible("#notice")
    page.tap("#start")
    chunks_shown(page, 1)
    page.tap("#pads [data-code=KeyW]")

    def walked() -> list[FrameReply]:
        """The frames made with the forward key (the infers already in flight at the tap were
        not: how many depends on the machine's pace)."""
        controls = [r for r in map(decode, list(sent)) if isinstance(r, ControlRequest)]
        forward = {c.event_id for c in controls if c.keys == ("w",)}
        assert forward, [c.keys for c in controls]
        return [r for r in map(decode_reply, list(received)) if isinstance(r, FrameReply) and r.event_id in forward]

    for _ in range(TIMEOUT_MS // 200):
        if walked():
            break
        page.wait_for_timeout(200)
    page.screenshot(path=str(ARTIFACTS / "web_phone.png"))
    page.tap("#reset")
    frames = walked()
    assert frames and all(np.diff(f.poses[:, 2, 3]).min() > 0.04 for f in frames)  # forward along +z
    assert errors == []
    page.context.close()


def test_the_page_sends_its_key_as_a_subprotocol_never_in_a_url(browser, served):
    """Issue 54 item 6: the page put the API key in the socket's URL (`?api_key=`: proxies log
    URLs, browsers keep them). A key given as `#api_key=` (a fragment never leaves the browser)
    now travels as the WebSocket subprotocol `lwf.bearer.<key>`, which the server echoes, and no
    URL the page sends holds it. (Handshake headers as Chromium sends them: DevTools protocol.)"""
    key = "k-web.1"
    page = browser.new_page()
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    handshakes: list[dict] = []
    sent_urls: list[str] = []
    cdp.on("Network.webSocketHandshakeResponseReceived", lambda e: handshakes.append(e["response"]))
    page.on("request", lambda r: sent_urls.append(r.url.split("#")[0]))  # what a server receives
    page.on("websocket", lambda ws: sent_urls.append(ws.url))
    try:
        page.goto(f"{served.http}/#api_key={key}")
        page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
        assert page.input_value("#api-key") == key
    finally:
        page.close()
    assert sent_urls and served.ws in sent_urls and not [u for u in sent_urls if key in u or "api_key" in u]
    (shake,) = handshakes
    asked, answered = ({k.lower(): v for k, v in shake[h].items()} for h in ("requestHeaders", "headers"))
    assert asked["sec-websocket-protocol"] == f"lwf.bearer.{key}"
    assert answered["sec-websocket-protocol"] == f"lwf.bearer.{key}"  # echoed: the socket opened


def test_a_page_of_another_origin_embeds_a_session_with_the_module(browser, served):
    """web/examples/embed.html, served by a second HTTP server (another port: another origin, one
    the app's auth.allowed_origins names: conftest.py), imports stream.js from the app (CORS),
    streams a session into its own <video> over the app's camera WebSocket, says the weights are
    random (the handshake does), and the key it holds and a drag on the video move the camera."""
    origin = served.examples
    sockets: list[str] = []
    sent: list[bytes] = []
    modules: dict[str, str | None] = {}
    errors: list[str] = []

    def on_socket(ws) -> None:
        sockets.append(ws.url)
        ws.on("framesent", lambda payload: sent.append(payload))

    page = browser.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("websocket", on_socket)
    page.on("response", lambda r: modules.update({r.url: r.headers.get("access-control-allow-origin")})
            if "/static/" in r.url else None)
    try:
        page.goto(f"{origin}/embed.html?server={served.http}/")
        page.wait_for_selector("#state[data-state=idle]", timeout=TIMEOUT_MS)
        assert page.evaluate("location.origin") == origin != served.http
        assert page.is_visible("#notice")
        assert page.text_content("#notice") == ("Demo model with random weights: the video is coloured noise "
                                                "that follows the camera.")
        page.click("#start")
        page.wait_for_function("Number(document.querySelector('#chunks').dataset.chunks) >= 1", timeout=TIMEOUT_MS)
        page.keyboard.down("KeyW")
        page.wait_for_function("Number(document.querySelector('#chunks').dataset.chunks) >= 3", timeout=TIMEOUT_MS)
        page.keyboard.up("KeyW")
        box = page.locator("#world").bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + 200, y, steps=5)  # drag right: look right ("l")
        page.mouse.up()
        page.wait_for_function("Number(document.querySelector('#chunks').dataset.chunks) >= 5", timeout=TIMEOUT_MS)
        page.wait_for_function("document.querySelector('#world').currentTime > 20 / 16", timeout=TIMEOUT_MS)
        assert page.evaluate("document.querySelector('#world').getVideoPlaybackQuality().totalVideoFrames") > 20
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web_embed.png"))
        page.click("#stop")
        page.wait_for_selector("#state[data-state=stopped]", timeout=TIMEOUT_MS)
    finally:
        page.close()
    assert errors == []
    assert set(sockets) == {served.ws}  # the app's camera socket, not one at the page's origin
    assert modules[f"{served.http}/static/stream.js"] == "*" and modules[f"{served.http}/static/server.js"] == "*"
    requests_ = [decode(m) for m in sent]
    infers = [r for r in requests_ if isinstance(r, InferRequest)]
    assert infers[0].image[:8] == b"\x89PNG\r\n\x1a\n" and infers[0].prompt == "a green field under a blue sky"
    assert all(r.from_keys for r in infers) and isinstance(requests_[-1], ResetRequest)
    assert ("w",) in [r.keys for r in requests_ if isinstance(r, ControlRequest)]
    assert any("l" in r.keys for r in requests_ if isinstance(r, ControlRequest))  # the drag


def test_a_full_server_shows_the_place_in_line_then_streams(browser, served):
    """Issue 46: both DiT slots held (the app's waiting room on, its default): Start puts the
    session in the server's line and the page says its position; it streams once a slot frees."""
    import asyncio  # noqa: PLC0415

    from session_holders import hold_sessions  # noqa: PLC0415

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    holders = asyncio.run_coroutine_threadsafe(hold_sessions(served.ws, 2), loop).result(120)
    try:
        page, errors = open_page(browser, served.http)
        page.click("#start")
        page.wait_for_function("document.querySelector('#status').textContent.includes('waits in line, position 1')",
                               timeout=TIMEOUT_MS)
        assert page.get_attribute("#connection", "data-state") == "starting"
    finally:
        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in holders))
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
    chunks_shown(page, 2)  # its turn came: it streams
    assert errors == []
    page.close()
