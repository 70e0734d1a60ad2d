"""`lwf-client` when the socket drops and the resume fails (issue 36 item 6): it writes the MP4
of the chunks it received, says what happened and how to go on, and exits 1. Against a
scripted server (no Ray): chunk 0 answered, the socket dropped while chunk 1 is in flight,
every resume refused."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from websockets.sync.server import serve

from client import cli
from protocol.codec import decode, encode
from protocol.errors import ErrorCode
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, InferRequest, ResumeRequest
from scripted_server import video
from support import EXAMPLES

TOKEN = "t" * 32
VIDEO0 = video(0, 9)


class Script:
    def __init__(self, refusal: ErrorCode) -> None:
        self.refusal = refusal
        self.resumes = 0

    def __call__(self, ws) -> None:
        ws.send(encode(CameraServerConfig(model="scripted", resume_grace_s=30.0)))
        for data in ws:
            req = decode(data)
            if isinstance(req, ResumeRequest):
                self.resumes += 1
                ws.send(encode(ErrorReply(code=self.refusal, message="scripted refusal", session_id=req.session_id)))
            elif isinstance(req, InferRequest) and req.client_chunk_id == 0:
                ws.send(encode(FrameReply(session_id=req.session_id, chunk_id=0, video=VIDEO0, num_frames=9,
                                          resolution=(32, 48), resume_token=TOKEN, client_chunk_id=0)))
            else:  # chunk 1 in flight: the socket drops
                ws.socket.close()
                return


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    scripts: list[Script] = []

    def start(refusal: ErrorCode) -> tuple[str, Script]:
        script = Script(refusal)
        server = serve(script, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scripts.append(script)
        return f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1/realtime/world/camera", script

    servers: list = []
    yield start
    for s in servers:
        s.shutdown()


@pytest.mark.parametrize("refusal", [ErrorCode.SESSION_LOST, ErrorCode.UNAUTHORIZED])
def test_a_failed_resume_keeps_what_was_received(scripted, tmp_path, capsys, refusal):
    url, script = scripted(refusal)
    out = tmp_path / "partial.mp4"
    code = cli.main(["play", str(EXAMPLES / "00"), "--url", url, "--frames", "33", "--out", str(out),
                     "--session-id", "sess"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert out.read_bytes() == VIDEO0  # the chunk received before the drop
    assert "incomplete: wrote" in err and "1 of 3 chunks received (9 frames)" in err, err
    assert "run the same command again" in err and script.resumes >= 1
    assert "scripted refusal" in err  # the server's reason
