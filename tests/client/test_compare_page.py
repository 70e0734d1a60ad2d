"""`lwf-client compare ... -o page.html` (client/compare_page.py): the videos side by side in one
self-contained page the browser plays, with no decoding here (the core install's comparison)."""
from __future__ import annotations

import base64
import re

import pytest

from client.cli import main
from client.compare_page import compare_page

MP4 = b"\x00\x00\x00\x18ftypisom" + bytes(range(40))  # an MP4's first box, then anything


def test_the_page_embeds_each_video_as_written_under_its_label(tmp_path):
    a, b = tmp_path / "walk.mp4", tmp_path / "walk.branch.mp4"
    a.write_bytes(MP4)
    b.write_bytes(MP4[::-1][:4] + MP4[4:])  # other bytes, still an ftyp box at 4
    out = tmp_path / "side.html"
    assert compare_page([a, b], out, ["main", "branch <1>"]) == 2
    page = out.read_text()
    sources = re.findall(r'src="data:video/mp4;base64,([^"]+)"', page)
    assert [base64.b64decode(s) for s in sources] == [a.read_bytes(), b.read_bytes()]
    assert "<figcaption>main</figcaption>" in page and "branch &lt;1&gt;" in page  # labels escaped


def test_the_cli_writes_a_page_and_refuses_what_is_not_an_mp4(tmp_path, capsys):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    a.write_bytes(MP4)
    b.write_bytes(b"not a video")
    assert main(["compare", str(a), str(a), "-o", str(tmp_path / "same.html")]) == 0
    assert "open it in a browser" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not an MP4" in err and str(b) in err
    with pytest.raises(ValueError, match="at least two"):
        compare_page([a], tmp_path / "one.html")
