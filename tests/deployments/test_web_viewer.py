"""The viewer page of a shared world (issue 56 item 8) as the ingress serves it: `/w/<world_id>`
is watch.html for any id (the page reads the id from its path, the token from the fragment,
which no request carries), with no referrer and revalidated; a path that is no world id is 404;
its scripts load from /static/; no script of the web client writes HTML from a string. In-process
(FastAPI TestClient); the page in Chromium: tests/client/test_web_share.py."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from deployments.ingress.server import app
from web_support import WEB, module_graph

WORLD_ID = "0cmC7jbZzZdNuvck-_x"


@pytest.fixture(scope="module")
def client():
    return TestClient(app)


def test_the_viewer_page_is_served_for_a_world_id(client):
    r = client.get(f"/w/{WORLD_ID}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text == (WEB / "watch.html").read_text(encoding="utf-8")
    assert r.headers["referrer-policy"] == "no-referrer" and r.headers["cache-control"] == "no-cache"
    assert "access-control-allow-origin" not in r.headers  # the page is not opened to other origins


@pytest.mark.parametrize("path", ["/w/a.b", "/w/%3Cscript%3E", "/w/" + "a" * 65, "/w/a%20b"])
def test_a_path_that_is_no_world_id_is_404(client, path):
    r = client.get(path)
    assert r.status_code == 404 and "<" not in r.text


def test_the_viewer_page_loads_its_scripts_from_static(client):
    html = (WEB / "watch.html").read_text(encoding="utf-8")
    assert re.findall(r'(?:src|href)="\.\./static/([^"]+)"', html) == ["style.css", "viewer.js"]
    graph = module_graph("viewer.js")
    assert {"viewer.js", "watch.js", "player.js", "server.js", "msgpack.js", "playback.js"} <= set(graph)
    for name in graph:
        assert client.get(f"/static/{name}").status_code == 200, name


def test_no_script_writes_html_from_a_string():
    """What the server sends (names, prompts, reasons) reaches the pages as text: textContent."""
    sinks = re.compile(r"\binnerHTML\b|\bouterHTML\b|insertAdjacentHTML|document\.write|createContextualFragment")
    found = {p.name: sinks.findall(p.read_text(encoding="utf-8")) for p in WEB.glob("*.js")}
    assert {name: hits for name, hits in found.items() if hits} == {}
