"""The page's saved worlds (web/worlds.js) in a real headless Chromium against the served app
(worlds kept in a local folder, tests/client/conftest.py): a session streams, Save answers with
the new world's id, My worlds lists it (its title set as text, not HTML), Open plays its stored
video and continues it live with `open` (frames play, chunks after the world's), Reopen makes
its chunks again from chunk 0 (`reopen`) and goes on with the keys, Download gives
its `.lwf` file and Delete takes it off the list and the server."""
from __future__ import annotations

import httpx
import msgpack
import pytest

CHROMIUM = "/usr/bin/chromium"  # as tests/client/test_web.py: Debian's package, no browser download
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 60_000
TITLE = "<b>my</b> walk & co"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield b
        b.close()


def open_page(browser, url: str, on_socket):
    """The page, connected (handshake read), and the list its script errors go to."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("websocket", on_socket)
    page.goto(url)
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    return page, errors


def chunks_shown(page, n: int) -> None:
    page.wait_for_function(f"Number(document.querySelector('#stat-chunks').dataset.chunks) >= {n}",
                           timeout=TIMEOUT_MS)


def test_save_list_open_download_and_delete_a_world(browser, served, tmp_path):
    sent: list[dict] = []

    def on_socket(ws) -> None:
        ws.on("framesent", lambda payload: sent.append(msgpack.unpackb(payload, raw=False)
                                                        if isinstance(payload, bytes) else {}))

    page, errors = open_page(browser, served.http + "/", on_socket)
    assert page.is_disabled("#save")  # nothing streams yet
    page.click("#start")
    chunks_shown(page, 3)
    page.fill("#save-title", TITLE)
    page.click("#save")
    page.wait_for_function("document.querySelector('#save-result').dataset.worldId", timeout=TIMEOUT_MS)
    world = page.eval_on_selector("#save-result", "e => e.dataset.worldId")
    assert f"Saved as world {world}" in page.text_content("#save-result")
    assert {"endpoint": "save", "title": TITLE}.items() <= next(m for m in sent if m.get("endpoint") == "save").items()

    row = f"#worlds-list li[data-id='{world}']"
    page.wait_for_selector(row, timeout=TIMEOUT_MS)
    assert page.text_content(f"{row} .world-title") == TITLE  # as text: no element made of it
    assert page.eval_on_selector(row, "li => li.querySelectorAll('b').length") == 0
    chunks = int(page.text_content(f"{row} .world-meta").split()[0])
    assert chunks >= 3

    page.click("#reset")
    page.click(f"{row} button[data-action=open]")
    page.wait_for_selector("#connection[data-state=streaming]", timeout=TIMEOUT_MS)
    opened = next(m for m in sent if m.get("endpoint") == "open")
    assert opened["world_id"] == world
    chunks_shown(page, chunks + 2)  # the world's chunks, then new ones from the keys held
    infers = [m for m in sent if m.get("endpoint") == "infer" and m.get("session_id") == opened["session_id"]]
    assert infers and infers[0]["client_chunk_id"] == chunks and "image" not in infers[0]  # continued, not restarted
    page.wait_for_function("document.querySelector('#video').currentTime > 1.0", timeout=TIMEOUT_MS)  # it plays

    page.click(f"{row} button[data-action=reopen]")  # its inputs made again, from chunk 0, then on
    reopen = next(m for m in sent if m.get("endpoint") == "reopen")
    assert reopen["world_id"] == world and reopen["session_id"] != opened["session_id"]
    def again() -> list[dict]:  # the page's own infers of the reopened session
        return [m for m in sent if m.get("endpoint") == "infer" and m.get("session_id") == reopen["session_id"]]

    for _ in range(TIMEOUT_MS // 200):  # the world's chunks made anew come first, then the page asks on
        if again():
            break
        page.wait_for_timeout(200)
    again = again()
    assert again and again[0]["client_chunk_id"] == chunks and "image" not in again[0]  # the server sent 0 .. n-1
    chunks_shown(page, chunks + 1)
    assert page.get_attribute("#connection", "data-state") == "streaming"
    page.wait_for_function("document.querySelector('#video').currentTime > 1.0", timeout=TIMEOUT_MS)

    with page.expect_download(timeout=TIMEOUT_MS) as download:
        page.click(f"{row} button[data-action=download]")
    lwf = tmp_path / "world.lwf"
    download.value.save_as(lwf)
    assert download.value.suggested_filename == f"{world}.lwf" and lwf.read_bytes()[:8] == b"LWFWORLD"

    page.click(f"{row} button[data-action=delete]")
    page.wait_for_selector(row, state="detached", timeout=TIMEOUT_MS)
    assert world not in {w["id"] for w in httpx.get(f"{served.http}/v1/worlds", timeout=10).json()["data"]}
    page.click("#reset")
    assert errors == []
    page.close()
