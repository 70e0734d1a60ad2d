"""One setting for the server's address (issue 57 item 1): `$LWF_URL` is the default --url of
every `lwf-client` command and the default url of `SyncWorldClient` and `WorldClient`; the
examples of README.md and client/README.md carry no --url (they say to set it once)."""
from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from client import cli
from client.session import DEFAULT_URL, URL_ENV, WorldClient
from client.sync import SyncWorldClient
from protocol.codec import decode, encode
from protocol.messages import FrameReply, InferRequest
from protocol.requests import SessionStart
from scripted_server import scripted_server, video
from support import EXAMPLES, REPO


class OneChunk:
    """Answers each connection's first infer with a valid chunk 0; counts the connections."""

    def __init__(self) -> None:
        self.connections = 0

    def __call__(self, ws) -> None:
        self.connections += 1
        for data in ws:
            req = decode(data)
            if isinstance(req, InferRequest):
                ws.send(encode(FrameReply(session_id=req.session_id, chunk_id=0, video=video(0, 9), num_frames=9,
                                          resolution=(32, 48), client_chunk_id=req.client_chunk_id)))


@pytest.mark.parametrize("command", ["play", "orbit", "dolly", "pan", "drive"])
def test_lwf_url_is_every_commands_default_url(command, monkeypatch):
    args = [command, *{"play": ["ex/"], "drive": ["w:1"]}.get(command, [])]
    monkeypatch.setenv(URL_ENV, "ws://elsewhere:9000")
    assert cli.parser().parse_args(args).url == "ws://elsewhere:9000"
    assert cli.parser().parse_args([*args, "--url", "ws://given:1"]).url == "ws://given:1"  # --url wins
    monkeypatch.delenv(URL_ENV)
    assert cli.parser().parse_args(args).url == DEFAULT_URL


def test_the_cli_and_both_clients_connect_to_lwf_url(monkeypatch, tmp_path):
    server = OneChunk()
    eye, k = np.eye(4, dtype=np.float32)[None].repeat(12, 0), np.float32([[500, 500, 416, 240]]).repeat(12, 0)
    start = SessionStart(np.zeros((36, 64, 3), np.uint8), "a street")
    with scripted_server(server) as url:
        monkeypatch.setenv(URL_ENV, url)
        out = tmp_path / "o.mp4"
        assert cli.main(["play", str(EXAMPLES / "00"), "--frames", "9", "--out", str(out)]) == 0
        assert out.read_bytes() == video(0, 9)
        with SyncWorldClient() as c:
            assert c.infer("sync", eye, k, start=start).chunk_id == 0

        async def connect() -> int:
            async with await WorldClient.connect() as c:
                return (await c.infer("async", eye, k, start=start)).chunk_id
        assert asyncio.run(connect()) == 0
    assert server.connections == 3


@pytest.mark.parametrize("doc", ["README.md", "client/README.md"])
def test_the_examples_take_the_address_from_lwf_url(doc):
    """No `lwf-client` example needs a --url that the others lack: none has one, the page says
    how to set `LWF_URL` once."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = [line for block in blocks for line in block.splitlines() if re.search(r"\blwf-client (?!compare)", line)]
    assert commands, f"{doc} has no lwf-client example"
    assert not [c for c in commands if "--url" in c], commands
    assert f"export {URL_ENV}=" in text
