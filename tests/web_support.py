"""The web client's tests: Chromium through Playwright for the browser tests
(tests/client/test_web*.py): the browser (a module fixture: `from web_support import browser`
in a test module), a page opened and connected, the wait for chunks shown; and the files a
module of web/ imports (`module_graph`)."""
from __future__ import annotations

import re

import pytest

from support import REPO

CHROMIUM = "/usr/bin/chromium"  # Debian's package (scripts/browser_deps.sh); no browser download
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / "artifacts"
TIMEOUT_MS = 60_000
WEB = REPO / "web"
_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s+["'](\./[^"']+)["']""", re.M)


def module_graph(entry: str) -> list[str]:
    """The files `entry` (in web/) imports, transitively, itself included."""
    seen, todo = [], [entry]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        todo += [m.removeprefix("./") for m in _IMPORT.findall((WEB / name).read_text(encoding="utf-8"))]
    return sorted(seen)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield b
        b.close()


def open_page(browser, url: str, on_socket=None):
    """The page, connected (handshake read), and the list its script errors go to."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if on_socket is not None:
        page.on("websocket", on_socket)
    page.goto(url)
    page.wait_for_selector("#connection[data-state=idle]", timeout=TIMEOUT_MS)
    return page, errors


def chunks_shown(page, n: int) -> None:
    page.wait_for_function(f"Number(document.querySelector('#stat-chunks').dataset.chunks) >= {n}",
                           timeout=TIMEOUT_MS)
