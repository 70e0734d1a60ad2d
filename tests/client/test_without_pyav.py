"""The client's core install has no PyAV (its `video` extra brings it; media/pyav.py): the
bytes still come, and what needs a decoder says so in one line naming the extra. PyAV is made
unimportable here the way a missing package is (`sys.modules["av"] = None`)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from client.cli import EXIT_USAGE, main
from client.sync import Chunk
from media import Fmp4Muxer
from media.pyav import MissingPyAV, require_av
from support import REPO

HINT = "pip install 'lingbot-world-client[video]'"


@pytest.fixture
def no_pyav(monkeypatch):
    for name in [m for m in sys.modules if m == "av" or m.startswith("av.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "av", None)


def _payload() -> bytes:
    frames = np.random.default_rng(0).integers(0, 255, (9, 32, 48, 3), dtype=np.uint8)
    return Fmp4Muxer(48, 32).add_chunk(frames)


def test_a_chunk_keeps_its_bytes_and_names_the_extra_for_frames(monkeypatch):
    video = _payload()  # encoded while PyAV is there
    chunk = Chunk(video, reply=None)
    with monkeypatch.context() as m:
        for name in [n for n in sys.modules if n == "av" or n.startswith("av.")]:
            m.delitem(sys.modules, name)
        m.setitem(sys.modules, "av", None)
        with pytest.raises(MissingPyAV) as caught:
            chunk.frames
        assert isinstance(caught.value, ImportError)
        message = str(caught.value)
        assert len(message.splitlines()) == 1 and "decoding frames needs PyAV" in message and HINT in message
        assert chunk.video == video
    assert chunk.frames.shape == (9, 32, 48, 3)  # with PyAV back, the same chunk decodes


def test_compare_without_pyav_is_one_line_naming_the_extra(no_pyav, capsys, tmp_path):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    a.write_bytes(b"not read")
    b.write_bytes(b"not read")
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "side.mp4")]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: compare needs PyAV") and HINT in err, err
    assert not (tmp_path / "side.mp4").exists()


def test_require_av_gives_the_module_when_installed():
    import av

    assert require_av("x") is av


def test_the_client_and_its_cli_load_no_pyav():
    """orbit, drive and a fork write the bytes as received: importing the client, its CLI and
    the reassembly loads no PyAV (what the core install relies on)."""
    code = ("import sys, client, client.cli, client.sync, client.compare, media, media.reassembly; "
            "print([m for m in sys.modules if m == 'av' or m.startswith('av.')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
