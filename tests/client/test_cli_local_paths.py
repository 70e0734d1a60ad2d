"""Local problems are the user's: named in one line, exit status 2, before any connection, no
traceback, and nothing received is lost (issue 47, item 4). No server: the checks come first
(the --url is a closed port, so a check that came too late would fail with status 1)."""
from __future__ import annotations

import os
from pathlib import Path
import stat
import subprocess
import sys

import pytest

from client.cli import EXIT_USAGE, main
from client.local_paths import LocalPathError, write_or_keep
from support import REPO

CLOSED = "ws://127.0.0.1:9"  # the discard port: nothing listens


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_out_in_a_missing_folder_is_refused_before_connecting(capsys, tmp_path):
    err = one_line_error(capsys, ["orbit", "--frames", "9", "--url", CLOSED, "--out", str(tmp_path / "no" / "x.mp4")])
    assert f"--out {tmp_path / 'no' / 'x.mp4'}" in err and "does not exist" in err and "server" not in err


def test_a_missing_image_is_refused_before_connecting(capsys, tmp_path):
    for command in (["drive", "w:1"], ["orbit", "--frames", "9"]):
        err = one_line_error(capsys, [*command, "--url", CLOSED, "--image", str(tmp_path / "none.png"),
                                      "--out", str(tmp_path / "x.mp4")])
        assert f"--image {tmp_path / 'none.png'}: no such file" in err
    assert list(tmp_path.iterdir()) == []


def test_compare_checks_its_videos_and_its_output_folder(capsys, tmp_path):
    a = tmp_path / "a.mp4"
    a.write_bytes(b"kept")
    err = one_line_error(capsys, ["compare", str(a), "-o", str(tmp_path / "gone" / "x.mp4")])
    assert f"-o {tmp_path / 'gone' / 'x.mp4'}" in err
    err = one_line_error(capsys, ["compare", str(a), str(tmp_path / "b.mp4"), "-o", str(tmp_path / "x.mp4")])
    assert f"VIDEO {tmp_path / 'b.mp4'}: no such file" in err
    assert a.read_bytes() == b"kept" and sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]


def test_an_unwritable_out_folder_is_refused(capsys, tmp_path, monkeypatch):
    """The folder's permissions as the OS answers them (os.access): a read-only folder where the
    tests run as a user, and the same answer stood in where they run as root (root writes anywhere)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == folder and mode & os.W_OK else real(p, mode))
    try:
        err = one_line_error(capsys, ["orbit", "--url", CLOSED, "--out", str(folder / "x.mp4")])
        assert "not writable" in err and str(folder) in err
    finally:
        folder.chmod(stat.S_IRWXU)


def test_other_local_paths_are_checked_too(capsys, tmp_path):
    (tmp_path / "f").write_bytes(b"")
    err = one_line_error(capsys, ["orbit", "--url", CLOSED, "--out", str(tmp_path), ])
    assert "is a folder" in err
    err = one_line_error(capsys, ["orbit", "--url", CLOSED, "--out", str(tmp_path / "o.mp4"), "--fork-at", "1",
                                  "--branch-out", str(tmp_path / "no" / "b.mp4")])
    assert f"--branch-out {tmp_path / 'no' / 'b.mp4'}" in err
    err = one_line_error(capsys, ["orbit", "--url", CLOSED, "--out", str(tmp_path / "o.mp4"),
                                  "--save-session", str(tmp_path / "f")])
    assert "--save-session" in err and "is a file" in err


def test_a_network_error_is_not_a_local_one(capsys, tmp_path):
    assert main(["orbit", "--frames", "9", "--url", CLOSED, "--out", str(tmp_path / "x.mp4")]) == 1
    assert "cannot reach the server at ws://127.0.0.1:9" in capsys.readouterr().err


def test_a_video_whose_write_fails_is_kept_elsewhere(tmp_path):
    data = os.urandom(1000)
    with pytest.raises(LocalPathError) as raised:
        write_or_keep(data, tmp_path / "gone" / "x.mp4", "sess")
    message = str(raised.value)
    assert f"cannot write {tmp_path / 'gone' / 'x.mp4'}" in message
    kept = message.rsplit("kept in ", 1)[1]
    try:
        with open(kept, "rb") as f:
            assert f.read() == data
    finally:
        os.unlink(kept)
    assert write_or_keep(data, tmp_path / "x.mp4", "sess").read_bytes() == data


def test_the_help_has_examples_and_names_every_argument():
    out = subprocess.run([sys.executable, "-m", "client.cli", "--help"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert "examples" in out and "lwf-client drive w:3" in out and "compare o.mp4 o.branch.mp4" in out
    drive = subprocess.run([sys.executable, "-m", "client.cli", "drive", "--help"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout
    assert "keys held per chunk" in drive and '"128*224"' in drive
    compare = subprocess.run([sys.executable, "-m", "client.cli", "compare", "--help"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    assert "MP4 files to put side by side" in compare
