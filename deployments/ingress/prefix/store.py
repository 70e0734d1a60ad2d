"""PrefixStore: finished chunks of past sessions, a trie per namespace, bounded in bytes (LRU).

The root of a namespace holds the text context of its prompt; a node at depth k + 1 holds chunk
k of every session whose first k + 1 chunk keys lead there (keys.py): the reply's video as sent
and what a session's journal keeps of the chunk (camera, y, clean latents, prompt-update
context, noise state after it), so that a session served from the store can be rebuilt on the
replicas by the journal's replay once it leaves the stored path (reuse.py).

Eviction: least recently used first, by bytes. Every access touches the node and then its
ancestors, so an ancestor is never older than its descendants and the oldest node is always a
leaf (a node is never removed while a deeper one that needs it stays). One store per ingress
replica, used from its event loop only (no locking).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from deployments.wire import NoiseSnapshot, PastChunk

Path = tuple[str, ...]  # (namespace, chunk key 0, chunk key 1, ...)


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """One finished chunk: its reply's payload and its journal entry."""

    video: Any  # the reply's `video` as sent (fMP4 bytes; raw frames in clip mode)
    num_frames: int
    mime_type: Optional[str]
    past: PastChunk
    noise: NoiseSnapshot  # the DiT's noise generator after the chunk
    # (DiT, VAE) ids of the snapshots the replicas may keep of the session that computed it,
    # after it (deployments/replicas/snapshots.py); None: the server keeps none
    snapshots: Optional[tuple[str, str]] = None

    @property
    def journal_bytes(self) -> int:
        """Bytes the chunk adds to a session's journal."""
        p = self.past
        return (p.poses.nbytes + p.intrinsics.nbytes + p.y.nbytes + p.latents.nbytes + self.noise.rng.nbytes
                + (0 if p.context is None else p.context.nbytes) + (0 if p.kv_growth is None else p.kv_growth.nbytes))

    @property
    def nbytes(self) -> int:
        video = self.video.nbytes if isinstance(self.video, np.ndarray) else len(self.video)
        return video + self.journal_bytes


@dataclass(eq=False, slots=True)
class _Node:
    path: Path
    nbytes: int
    context: Optional[np.ndarray] = None  # a root's
    chunk: Optional[StoredChunk] = None  # a chunk node's
    children: dict[str, "_Node"] = field(default_factory=dict)


class PrefixStore:
    """Stored chunks by namespace and chunk keys; at most `max_bytes` held."""

    def __init__(self, max_bytes: int, metrics: Any = None) -> None:
        """`metrics`: a `PrefixMetrics` (deployments/metrics.py) told of the bytes held and the
        evictions; None in tests."""
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._roots: dict[str, _Node] = {}
        self._lru: OrderedDict[Path, _Node] = OrderedDict()  # oldest first
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        """Nodes held (roots included)."""
        return len(self._lru)

    def context(self, ns: str) -> Optional[np.ndarray]:
        """The text context of namespace `ns` (None: the store holds nothing of it)."""
        root = self._roots.get(ns)
        return None if root is None else root.context

    def get(self, ns: str, keys: Sequence[str]) -> Optional[StoredChunk]:
        """Chunk len(keys) - 1 of the sessions of `ns` whose chunks so far had `keys` (touched)."""
        path = self._walk(ns, keys)
        if path is None or not keys:
            return None
        self._touch(path)
        return path[-1].chunk

    def put(self, ns: str, keys: Sequence[str], chunk: StoredChunk, context: np.ndarray) -> bool:
        """Store chunk len(keys) - 1 of `ns` (`context`: the namespace's text context, for a
        root that was evicted or never made). False when it was not stored: held already, its
        earlier chunks are not (evicted), or it alone is over the budget."""
        assert keys, "put: a chunk needs its key"
        root = self._roots.get(ns)
        new_root = root is None
        if new_root:
            if len(keys) > 1:
                return False
            root = _Node((ns,), context.nbytes, context=context)
        parents = [root] if new_root else self._walk(ns, keys[:-1])
        if parents is None:
            return False
        parent = parents[-1]
        if keys[-1] in parent.children:
            self._touch([*parents, parent.children[keys[-1]]])
            return False
        node = _Node((ns, *keys), chunk.nbytes, chunk=chunk)
        if node.nbytes + (root.nbytes if new_root else 0) > self.max_bytes:
            return False
        if new_root:
            self._roots[ns] = root
            self._add(root)
        parent.children[keys[-1]] = node
        self._add(node)
        self._touch([*parents, node])
        self._evict()
        return True

    def _walk(self, ns: str, keys: Sequence[str]) -> Optional[list[_Node]]:
        """The nodes from the root of `ns` along `keys` (None where the path ends early)."""
        node = self._roots.get(ns)
        if node is None:
            return None
        path = [node]
        for key in keys:
            node = node.children.get(key)
            if node is None:
                return None
            path.append(node)
        return path

    def _touch(self, path: list[_Node]) -> None:
        for node in reversed(path):  # the deepest first: its ancestors end up more recent
            self._lru.move_to_end(node.path)

    def _add(self, node: _Node) -> None:
        self._lru[node.path] = node
        self.nbytes += node.nbytes
        self._report()

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._lru:
            self._remove(next(iter(self._lru.values())))
            self.evictions += 1
            if self._metrics is not None:
                self._metrics.count_eviction()
        self._report()

    def _remove(self, node: _Node) -> None:
        """Drop `node` with whatever is below it (nothing: the oldest is a leaf)."""
        for child in list(node.children.values()):
            self._remove(child)
        del self._lru[node.path]
        self.nbytes -= node.nbytes
        if len(node.path) == 1:
            del self._roots[node.path[0]]
        else:
            parent = self._walk(node.path[0], node.path[1:-1])
            if parent is not None:
                parent[-1].children.pop(node.path[-1], None)

    def _report(self) -> None:
        if self._metrics is not None:
            self._metrics.held(self.nbytes, len(self._lru))
