"""WorldStore: the one interface every backend implements (bytes under checked keys).

Contract (tests/deployments/worlds/test_store_contract.py runs it on every backend):
- `put(key, data)` is atomic: a reader sees the old object, the new one, or none, never a part;
- `get(key)` -> the bytes, or WorldNotFound;
- `list(prefix)` -> every object under `prefix` (`prefix` + "/" + ...), sorted by key;
- `delete(key)` removes it (no error when it is absent); `delete_prefix(prefix)` everything under it;
- every key is checked (deployments/worlds/ids.py) before a backend sees it: BadWorldKey;
- a backend that fails raises StoreUnavailable (WorldNotFound and BadWorldKey are not failures).
The calls block (file or network I/O): the ingress runs them off its event loop (writer.py).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from deployments.worlds.ids import check_key, check_prefix


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str  # relative to the store's root / prefix
    size: int  # bytes
    modified: float  # seconds since the epoch


class WorldStore(abc.ABC):
    """Bytes under keys; one instance per process is enough (the calls are thread-safe)."""

    name = "store"  # the backend, in logs and /healthz

    def put(self, key: str, data: bytes) -> None:
        self._put(check_key(key), bytes(data))

    def get(self, key: str) -> bytes:
        return self._get(check_key(key))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return sorted(self._list(check_prefix(prefix)), key=lambda o: o.key)

    def delete(self, key: str) -> None:
        self._delete(check_key(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (a non-empty key); returns how many."""
        objects = self.list(check_key(prefix))
        for o in objects:
            self._delete(o.key)
        return len(objects)

    @abc.abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> list[ObjectInfo]: ...

    @abc.abstractmethod
    def _delete(self, key: str) -> None: ...
