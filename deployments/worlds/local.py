"""LocalStore: the world store in a local directory (the embedded default).

A key is a relative path under the root (ids.py allows no `..`, no absolute path, no leading
dot). A put writes a temporary file beside the target (`.tmp-<random>`, never a valid key, so
never listed or read), flushes it to disk and renames it over the target (`os.replace`: atomic
on one file system), so a reader sees the old bytes or the new, never a part; a put that fails
removes its temporary file. A failing file system raises StoreUnavailable.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from deployments.worlds.errors import StoreUnavailable, WorldNotFound
from deployments.worlds.ids import SEGMENT
from deployments.worlds.store import ObjectInfo, WorldStore

TMP_PREFIX = ".tmp-"


class LocalStore(WorldStore):
    name = "local"

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = self.root.joinpath(*key.split("/"))
        assert path.is_relative_to(self.root), "a checked key stays under the root"
        return path

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(TMP_PREFIX + secrets.token_hex(8))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreUnavailable(f"local store: write failed ({type(e).__name__})") from e

    def _get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise WorldNotFound("no such object") from None
        except OSError as e:
            raise StoreUnavailable(f"local store: read failed ({type(e).__name__})") from e

    def _list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix) if prefix else self.root
        out = []
        try:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if SEGMENT.fullmatch(d)]
                for name in filenames:
                    if not SEGMENT.fullmatch(name):  # temporary files
                        continue
                    path = Path(dirpath, name)
                    try:
                        st = path.stat()
                    except FileNotFoundError:  # deleted while listing
                        continue
                    out.append(ObjectInfo(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        except OSError as e:
            raise StoreUnavailable(f"local store: list failed ({type(e).__name__})") from e
        return out

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise StoreUnavailable(f"local store: delete failed ({type(e).__name__})") from e
        for parent in path.parents:  # empty folders go with their last object
            if parent == self.root:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or gone): done
                break
