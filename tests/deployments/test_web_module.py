"""The web client as an ES module other pages import (issue 47): the ingress serves web/ at
/static/ to any origin (CORS), every file stream.js imports is there, and the example page that
embeds it is served too. In-process (FastAPI TestClient)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from deployments.ingress.server import app
from web_support import _IMPORT, module_graph

FOREIGN = {"Origin": "https://game.example"}


@pytest.fixture(scope="module")
def client():
    return TestClient(app)


def test_the_checker_reads_static_and_re_exports():
    assert _IMPORT.findall('import { a } from "./x.js";\nexport { b } from "./y.js";\nconst c = "./z.js";\n') == \
        ["./x.js", "./y.js"]


def test_stream_js_and_what_it_imports_load_from_another_origin(client):
    graph = module_graph("stream.js")
    assert {"stream.js", "server.js", "camera.js", "player.js", "msgpack.js"} <= set(graph)
    for name in graph:
        r = client.get(f"/static/{name}", headers=FOREIGN)
        assert r.status_code == 200, name
        assert r.headers["access-control-allow-origin"] == "*", name
        assert r.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript"), name
    assert "export class LiveStream" in client.get("/static/stream.js").text


def test_a_revalidated_module_still_answers_any_origin(client):
    first = client.get("/static/stream.js", headers=FOREIGN)
    again = client.get("/static/stream.js", headers={**FOREIGN, "If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.headers["access-control-allow-origin"] == "*"


def test_the_example_page_is_served(client):
    """(tests/test_package.py checks that web/ and web/examples/ install as package data.)"""
    r = client.get("/static/examples/embed.html")
    assert r.status_code == 200 and 'import(new URL("static/stream.js", server)' in r.text


def test_the_page_itself_is_not_opened_to_other_origins(client):
    """Only the module files carry CORS: the page at / and the API routes stay as they were."""
    r = client.get("/", headers=FOREIGN)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
