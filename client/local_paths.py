"""The CLI's local files, checked before it connects: a missing folder or image is the user's
to fix, not the server's (one line naming the path, exit status 2), and a video received is
never lost to a path that fails later (`write_or_keep`)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class LocalPathError(Exception):
    """A local file or folder the command cannot use; the message names it, in one line."""


def check_output(path: Path, option: str) -> None:
    """`path` can be written: its folder exists and is writable, and it is no folder itself."""
    folder = path.parent
    if not folder.is_dir():
        raise LocalPathError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LocalPathError(f"{option} {path}: the folder {folder} is not writable")
    if path.is_dir():
        raise LocalPathError(f"{option} {path} is a folder; give a file name")


def check_folder(path: Path, option: str) -> None:
    """A folder the command creates or fills: its parent exists and is writable."""
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise LocalPathError(f"{option} {path}: the folder is not writable")
        return
    if path.exists():
        raise LocalPathError(f"{option} {path} is a file; give a folder")
    check_output(path, option)


def check_input(path: Path, option: str) -> None:
    """`path` is a readable file."""
    if not path.is_file():
        raise LocalPathError(f"{option} {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    if not os.access(path, os.R_OK):
        raise LocalPathError(f"{option} {path}: not readable")


def write_or_keep(data: bytes, path: Path, name: str) -> Path:
    """Write `data` to `path`; when that fails, to a file of the temporary folder instead, and
    raise `LocalPathError` saying where it is (nothing received is lost)."""
    try:
        path.write_bytes(data)
        return path
    except OSError as e:
        fd, kept = tempfile.mkstemp(prefix=f"{name}-", suffix=path.suffix or ".mp4")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        raise LocalPathError(f"cannot write {path} ({e.strerror or e}); the video was kept in {kept}") from None
