"""The viewer page's "Ask for the controls" and "Fork from here", and the owner's players
panel, in headless Chromium against the served app (issue 56 item 8). The owner's page shares
with `controls: turns`; a viewer page asks, the owner passes it the controls (sent on the
owner's socket by the test), and the viewer's keys drive: `control`s on the watch route naming
the world, the chunks they made marked on both sides. The owner's panel lists the viewer, then
as a player once it asks; its Grant gives it the controls, its Kick ends its watch. In `crowd`
the chunks the viewer's vote made say "your input". Then "Fork from here" takes the viewer to
the main page, which forks the world and plays the fork's new chunks as a session of its own.
"""
from __future__ import annotations

import itertools
import re

import msgpack

from protocol.codec import decode, encode
from protocol.messages import (ControlRequest, ErrorReply, ForkRequest, InferRequest, PassControlsRequest,
                               ResumeRequest, ShareRequest)
from protocol.sharing import Watching
from web_support import TIMEOUT_MS, browser, chunks_shown  # noqa: F401 (the fixture)


def _owner_page(browser, served):
    """The main page with its socket routed through the test: what it sends and gets, and the
    server side, on which the test speaks as the owner."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sock: dict = {"sent": [], "got": []}

    def route(ws) -> None:
        server = ws.connect_to_server()
        sock["server"], sock["page"] = server, ws

        def to_server(message) -> None:
            sock["sent"].append(message)
            server.send(message)

        def to_page(message) -> None:
            sock["got"].append(msgpack.unpackb(message, raw=False) if isinstance(message, bytes) else message)
            ws.send(message)

        ws.on_message(to_server)
        server.on_message(to_page)

    page.route_web_socket("**/v1/realtime/world/camera*", route)
    page.goto(served.http + "/")
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    return page, errors, sock


def _share(page, controls: str) -> tuple[str, str, str]:
    page.click("#start")
    chunks_shown(page, 1)
    page.select_option("#share-controls", controls)
    page.click("#share")
    page.wait_for_function("document.querySelector('#share-link').value !== ''", timeout=TIMEOUT_MS)
    link = page.input_value("#share-link")
    world_id, token = re.search(r"/w/([A-Za-z0-9_-]+)#token=([A-Za-z0-9_-]+)$", link).groups()
    return link, world_id, token


def _viewer_page(browser, link: str):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    sock: dict = {"sent": [], "got": [], "urls": []}
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: sock["urls"].append(r.url))

    def on_socket(ws) -> None:
        sock["urls"].append(ws.url)
        ws.on("framesent", lambda m: sock["sent"].append(msgpack.unpackb(m, raw=False)))
        ws.on("framereceived", lambda m: sock["got"].append(msgpack.unpackb(m, raw=False)))

    page.on("websocket", on_socket)
    page.goto(link)
    page.wait_for_selector("#connection[data-state=watching]", timeout=TIMEOUT_MS)
    return page, errors, sock


def test_a_viewer_asks_gets_the_controls_and_its_keys_drive_the_world(browser, served):
    owner, owner_errors, own = _owner_page(browser, served)
    link, world_id, _ = _share(owner, "turns")
    shares = [r for r in map(decode, own["sent"]) if isinstance(r, ShareRequest)]
    assert [s.controls for s in shares] == ["turns"]

    viewer, viewer_errors, view = _viewer_page(browser, link)
    viewer_id = view["got"][0]["viewer_id"]
    assert viewer.is_visible("#ask-controls") and viewer.is_visible("#fork-here")
    viewer.keyboard.down("KeyW")  # not this viewer's turn: nothing is sent
    viewer.keyboard.up("KeyW")
    viewer.click("#ask-controls")
    viewer.wait_for_selector("#role[data-role=waiting]", timeout=TIMEOUT_MS)
    assert viewer.text_content("#role") == "waiting for a turn" and viewer.is_hidden("#ask-controls")

    own["server"].send(encode(PassControlsRequest(session_id=shares[0].session_id, viewer_id=viewer_id)))
    viewer.wait_for_selector("#role[data-role=driving]", timeout=TIMEOUT_MS)
    assert viewer.text_content("#role").startswith("you drive")
    viewer.keyboard.down("KeyW")
    viewer.wait_for_function("Number(document.querySelector('#your-input').dataset.chunks) >= 1", timeout=TIMEOUT_MS)
    assert viewer.is_visible("#your-input")
    viewer.keyboard.up("KeyW")

    sent = [m for m in view["sent"] if m["endpoint"] != "watch"]
    assert sent[0] == {"endpoint": "ask_controls", "session_id": world_id}
    controls = [m for m in sent[1:] if m["endpoint"] == "control"]
    assert len(controls) == len(sent) - 1 and all(m["session_id"] == world_id for m in controls)
    assert [m["event_id"] for m in controls] == sorted({m["event_id"] for m in controls})  # increasing
    assert ["w"] in [m["keys"] for m in controls]
    mine = _until(owner, lambda: [r for r in own["got"] if isinstance(r, dict) and r.get("type") == "frame"
                                  and r.get("player") == viewer_id])  # the owner's frames say whose input made them
    assert {r["event_id"] for r in mine} <= {m["event_id"] for m in controls}
    assert owner.get_attribute("#connection", "data-state") == "streaming"  # the `players` answer stopped nothing
    owner.click("#reset")
    assert owner_errors == [] and viewer_errors == []
    viewer.close()
    owner.close()


def test_the_owners_control_lag_counts_only_the_frames_its_own_keys_made(browser, served):
    """While a viewer holds the controls, the owner's keys make nothing: the frames the viewer's
    keys made echo the viewer's event ids, which must not be read as the owner's (before, the
    page took a viewer's id at least its own pending one as its key state shown, and measured a
    lag for a key that made nothing)."""
    owner, owner_errors, own = _owner_page(browser, served)
    link, world_id, _ = _share(owner, "turns")
    session_id = next(r.session_id for r in map(decode, own["sent"]) if isinstance(r, ShareRequest))
    viewer, viewer_errors, view = _viewer_page(browser, link)
    viewer_id = view["got"][0]["viewer_id"]
    viewer.click("#ask-controls")
    viewer.wait_for_selector("#role[data-role=waiting]", timeout=TIMEOUT_MS)
    own["server"].send(encode(PassControlsRequest(session_id=session_id, viewer_id=viewer_id)))
    viewer.wait_for_selector("#role[data-role=driving]", timeout=TIMEOUT_MS)

    def owner_controls() -> list[ControlRequest]:
        return [r for r in map(decode, own["sent"]) if isinstance(r, ControlRequest)]

    before = len(owner_controls())
    owner.evaluate("document.activeElement.blur()")  # (the Share link's field has the focus)
    owner.keyboard.down("KeyD")  # the owner's control: sent, but the viewer holds the controls
    owner_ids = _until(owner, lambda: [r.event_id for r in owner_controls()[before:]])
    keys = itertools.cycle(["KeyW", "KeyA", "KeyS"])

    def viewer_frame_past_the_owners():
        key = next(keys)  # each press and release is a control of the viewer's: its ids climb
        viewer.keyboard.down(key)
        viewer.keyboard.up(key)
        return [r for r in own["got"] if isinstance(r, dict) and r.get("type") == "frame"
                and r.get("player") == viewer_id and (r.get("event_id") or 0) >= max(owner_ids)]

    try:
        _until(owner, viewer_frame_past_the_owners, timeout_s=60)
    except AssertionError:
        frames = [(r.get("player"), r.get("event_id")) for r in own["got"] if isinstance(r, dict) and r.get("type") == "frame"]
        raise AssertionError(f"no frame of the viewer's past the owner's event ids {owner_ids}: {frames}")
    owner.wait_for_timeout(500)  # the page has handled the frame (its stats follow each frame)
    # the key state the owner's page says its video shows: its own last, not the viewer's
    shown = re.search(r"key state (\d+|null)", owner.text_content("#stat-lag") or "")
    assert shown is None or shown.group(1) == "null" or int(shown.group(1)) < max(owner_ids), shown.group(0)
    owner.keyboard.up("KeyD")
    owner.click("#reset")
    assert owner_errors == [] and viewer_errors == []
    viewer.close()
    owner.close()


def test_the_owners_panel_lists_the_viewer_grants_it_the_controls_and_kicks_it(browser, served):
    owner, owner_errors, own = _owner_page(browser, served)
    link, world_id, _ = _share(owner, "turns")
    owner.wait_for_selector("#players-panel:not([hidden]) #panel-viewers[data-count='0']", timeout=TIMEOUT_MS)
    assert owner.text_content("#panel-holder") == "you drive" and owner.is_visible("#pass-controls")
    viewer, viewer_errors, view = _viewer_page(browser, link)
    vid = view["got"][0]["viewer_id"]
    row = f"#panel-list li[data-viewer='{vid}']"
    owner.wait_for_selector(f"{row}[data-role=viewer]", timeout=TIMEOUT_MS)
    assert owner.get_attribute("#panel-viewers", "data-count") == "1"
    assert owner.text_content(f"{row} .who") == vid and owner.text_content(f"{row} .role") == "watching"
    viewer.click("#ask-controls")
    owner.wait_for_selector(f"{row}[data-role=player]", timeout=TIMEOUT_MS)  # told unasked: it asked
    assert [owner.text_content(f"{row} button:nth-of-type({i})") for i in (1, 2, 3, 4)] == \
        ["Grant", "Make director", "Revoke", "Kick"]
    assert owner.evaluate("[...document.querySelectorAll('#pass-to option')].map(o => o.value)") == ["", vid]
    owner.click(f"{row} button[data-act=grant]")
    viewer.wait_for_selector("#role[data-role=driving]", timeout=TIMEOUT_MS)
    owner.wait_for_selector(f"{row}[data-role=holder]", timeout=TIMEOUT_MS)
    assert owner.text_content("#panel-holder") == f"{vid} drives" and owner.is_hidden(f"{row} button[data-act=grant]")
    owner.click(f"{row} button[data-act=kick]")
    viewer.wait_for_selector("#connection[data-state=ended]", timeout=TIMEOUT_MS)
    owner.wait_for_selector("#panel-viewers[data-count='0']", timeout=TIMEOUT_MS)
    assert viewer.text_content("#status").startswith("The world's owner removed you")
    assert owner.evaluate("document.querySelectorAll('#panel-list li').length") == 0

    sent = [r for r in map(decode, own["sent"]) if not isinstance(r, (ControlRequest, InferRequest))]
    assert sent[0].notify_players is True  # the share asks for the unasked `players`
    assert [(r.endpoint, r.viewer_id) for r in sent[1:]] == [("pass_controls", vid), ("kick", vid)]  # a player already
    told = [r for r in own["got"] if isinstance(r, dict) and r.get("type") == "players" and r.get("notice")]
    answers = _until(owner, lambda: [r for r in own["got"] if isinstance(r, dict) and r.get("type") == "players"
                                     and not r.get("notice")][1:])  # (in order, behind the infers in flight)
    assert told and answers[0]["viewer_ids"] == [] and answers[0]["holder"] == "owner"  # the kick's
    assert owner.get_attribute("#connection", "data-state") == "streaming"
    owner.click("#reset")
    assert owner_errors == [] and viewer_errors == []
    viewer.close()
    owner.close()


def test_the_owners_panel_follows_its_world_after_a_resume(browser, served):
    """The owner's socket drops; the page resumes on a new one and shares again (the same world
    and link): a viewer that joins then is listed on the panel."""
    owner, owner_errors, own = _owner_page(browser, served)
    link, world_id, _ = _share(owner, "owner")
    owner.wait_for_selector("#players-panel:not([hidden])", timeout=TIMEOUT_MS)
    own["page"].close(code=4000, reason="dropped")
    own["server"].close()
    _until(owner, lambda: len([r for r in map(decode, own["sent"]) if isinstance(r, ShareRequest)]) == 2)
    assert any(isinstance(r, ResumeRequest) for r in map(decode, own["sent"]))  # on the new socket, before it
    viewer, viewer_errors, view = _viewer_page(browser, link)
    vid = view["got"][0]["viewer_id"]
    owner.wait_for_selector(f"#panel-list li[data-viewer='{vid}'][data-role=viewer]", timeout=TIMEOUT_MS)
    assert owner.input_value("#share-link") == link  # the same world
    owner.click("#reset")
    assert owner_errors == [] and viewer_errors == []
    viewer.close()
    owner.close()


def test_a_crowd_chunk_the_viewers_vote_made_says_your_input(browser, served):
    owner, owner_errors, own = _owner_page(browser, served)
    link, world_id, _ = _share(owner, "crowd")
    viewer, viewer_errors, view = _viewer_page(browser, link)
    vid = view["got"][0]["viewer_id"]
    viewer.click("#ask-controls")
    viewer.wait_for_selector("#role[data-role=driving]", timeout=TIMEOUT_MS)  # a voter at once
    owner.evaluate("document.activeElement.blur()")  # (the Share link's field has the focus: keys typed there)
    owner.keyboard.down("KeyW")  # the owner's page votes too (its first `control` went at Start): W 2 of 2
    viewer.keyboard.down("KeyW")
    viewer.wait_for_function("Number(document.querySelector('#your-input').dataset.chunks) >= 1", timeout=TIMEOUT_MS)
    viewer.keyboard.up("KeyW")
    owner.keyboard.up("KeyW")
    voted = [r for r in view["got"] if r.get("type") == "frame" and r.get("player") == "crowd" and r.get("voters")]
    assert voted and all(r["voters"] == [vid] for r in voted)
    owner.click("#reset")
    assert owner_errors == [] and viewer_errors == []
    viewer.close()
    owner.close()


def test_fork_from_here_opens_the_main_page_on_a_session_of_its_own(browser, served):
    owner, owner_errors, _ = _owner_page(browser, served)
    link, world_id, token = _share(owner, "owner")
    viewer, errors, view = _viewer_page(browser, link)
    assert viewer.is_hidden("#ask-controls")  # the owner's controls: nobody asks
    viewer.click("#fork-here")
    viewer.wait_for_selector("#connection[data-state=streaming]", timeout=TIMEOUT_MS)  # the main page now
    assert viewer.evaluate("window.location.hash") == ""  # the fragment was read and cleared
    fork = ForkRequest.model_validate(next(m for m in view["sent"] if m.get("endpoint") == "fork"))
    assert (fork.session_id, fork.world_id, fork.watch_token, fork.at_chunk) == (world_id, world_id, token, None)
    forked = next(r for r in view["got"] if r.get("type") == "forked")
    k = forked["next_chunk_id"]
    chunks_shown(viewer, k + 2)  # the fork's own chunks: k on, played from the world's head's time
    viewer.wait_for_function(f"document.querySelector('video').currentTime > {(9 + 12 * (k - 1)) / 16 + 0.5}",
                             timeout=TIMEOUT_MS)
    frames = [r for r in view["got"] if r.get("type") == "frame" and r.get("session_id") == forked["session_id"]]
    assert [f["chunk_id"] for f in frames[:2]] == [k, k + 1]
    assert all(token not in url for url in view["urls"])  # the token never left in a URL
    assert owner.get_attribute("#connection", "data-state") == "streaming"  # the world goes on
    viewer.keyboard.down("KeyD")  # driven with the keys, as any session of the page
    _until(viewer, lambda: [m for m in view["sent"] if m.get("endpoint") == "control"
                            and m["session_id"] == forked["session_id"] and m["keys"] == ["d"]])
    viewer.click("#reset")
    owner.click("#reset")
    assert errors == [] and owner_errors == []
    viewer.close()
    owner.close()


def test_a_refused_fork_and_a_refused_ask_are_said_as_text(browser, served):
    """A fork link whose token opens nothing: the server's `unauthorized`, said on the main page
    (which stays ready to Start). A routed watch socket refuses the viewer's ask (`forbidden`):
    said as text, and the viewer may ask again."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(served.http + "/#fork=wX&token=no-such-token")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Cannot fork')",
                           timeout=TIMEOUT_MS)
    assert page.text_content("#status").startswith("Cannot fork the shared world (unauthorized): ")
    assert page.evaluate("window.location.hash") == "" and not page.is_disabled("#start")

    def route(ws) -> None:
        def on_message(message) -> None:
            msg = msgpack.unpackb(message, raw=False)
            if msg["endpoint"] == "watch":
                ws.send(encode(Watching(world_id="wX", viewers=1, controls="turns", viewer_id="00000000000000aa",
                                        holder="owner")))
            else:
                ws.send(encode(ErrorReply(code="forbidden", message="<b>not</b> now", session_id="wX")))
        ws.on_message(on_message)

    page.route_web_socket("**/v1/realtime/world/watch*", route)
    page.goto(served.http + "/w/wX#token=t0k")
    page.wait_for_selector("#connection[data-state=watching]", timeout=TIMEOUT_MS)
    page.click("#ask-controls")
    page.wait_for_function("document.querySelector('#status').dataset.level === 'error'", timeout=TIMEOUT_MS)
    assert page.text_content("#status") == "Error (forbidden): <b>not</b> now"
    assert not page.is_disabled("#ask-controls") and page.evaluate("document.querySelectorAll('b').length") == 0
    assert errors == []
    page.close()


def _until(page, found, timeout_s: float = TIMEOUT_MS / 1000):
    """What `found()` returns once it is truthy (the page's socket events are handled meanwhile)."""
    for _ in range(int(timeout_s * 10)):
        if got := found():
            return got
        page.wait_for_timeout(100)
    raise AssertionError("not found in time")
