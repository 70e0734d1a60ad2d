"""Worlds: a principal's worlds in a WorldStore (create, chunks, list, load, delete), with its
byte quota and the store's retention.

Layout under the store's root: `p/<principal digest>/w/<world id>/` holds `manifest.json`,
`image.npy`, `context.npy` (the opening prompt's encoding, once there) and `c/<k>/` per chunk
(chunks.py). Every call names the principal: a world is found only under its owner's digest,
so another principal's world id is `world_not_found`, exactly like an id that does not exist.
A world is listed once its manifest is there; `delete` removes the manifest first.

Quota: `quota_bytes` per principal, counted from the store (listed once per principal and
process, then kept up to date by this process's writes and deletes); a write that would pass
it is refused before any byte is written (QuotaExceeded). Retention: `sweep()` deletes the
worlds whose manifest was not updated for `retention_s`.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from deployments.config import AppArgs
from deployments.wire import SessionOptions
from deployments.worlds.chunks import (COMMIT, ChunkRecord, chunk_dir, chunk_from_parts, chunk_parts, decode_array,
                                       encode_array, read_commit, sha256)
from deployments.worlds.errors import BadWorldFile, QuotaExceeded, WorldError, WorldNotFound
from deployments.worlds.ids import check_world_id, new_world_id, principal_dir, world_dir
from deployments.worlds.manifest import Manifest, digest, served_model
from deployments.worlds.store import WorldStore

MANIFEST, IMAGE, CONTEXT = "manifest.json", "image.npy", "context.npy"


@dataclass(frozen=True, slots=True)
class World:
    """A whole world as loaded: its manifest, image, opening context and committed chunks."""

    manifest: Manifest
    image: np.ndarray
    context: Optional[np.ndarray]
    chunks: list[ChunkRecord]


def new_manifest(owner: str, title: str, args: AppArgs, options: SessionOptions, now: float) -> Manifest:
    model = served_model(args)
    m = args.model
    model_id = m.preset + (f"/{os.path.basename(m.checkpoint.rstrip('/'))}" if m.checkpoint else "")
    attention = m.attention + ("+fp8" if m.fp8_attention else "")
    return Manifest(new_world_id(), owner, title, model_id, m.dtype, attention, model, digest(model),
                    options.height, options.width, options.seed, options.prompt, options.total_latent_frames,
                    options.translation_scale, tuple(options.intrinsics_resolution), now, now, 0, 0)


class Worlds:
    def __init__(self, store: WorldStore, quota_bytes: Optional[int] = None, retention_s: Optional[float] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.quota_bytes = quota_bytes
        self.retention_s = retention_s
        self._clock = clock
        self._lock = threading.Lock()
        self._usage: dict[str, int] = {}  # principal digest -> bytes in the store

    # ---- one world's objects ----

    def _key(self, principal: str, world_id: str, part: str) -> str:
        return f"{world_dir(principal, world_id)}/{part}"

    def _write(self, principal: str, world_id: str, parts: dict[str, bytes], replaced: int = 0) -> int:
        """Write `parts` (in order) after the quota check; returns the bytes added."""
        owner = principal_dir(principal)
        added = sum(len(d) for d in parts.values()) - replaced
        with self._lock:
            used = self._usage_locked(owner)
            if self.quota_bytes is not None and added > 0 and used + added > self.quota_bytes:
                raise QuotaExceeded(f"the world store keeps {self.quota_bytes} bytes per principal; "
                                    f"{used} are in use and this write needs {added} more")
            self._usage[owner] = used + added
        try:
            for name, data in parts.items():
                self.store.put(self._key(principal, world_id, name), data)
        except BaseException:
            with self._lock:
                self._usage.pop(owner, None)  # counted again from the store
            raise
        return added

    def _usage_locked(self, owner: str) -> int:
        if owner not in self._usage:
            self._usage[owner] = sum(o.size for o in self.store.list(owner))
        return self._usage[owner]

    def usage(self, principal: str) -> int:
        """Bytes the principal's worlds take in the store."""
        with self._lock:
            return self._usage_locked(principal_dir(principal))

    # ---- the API ----

    def create(self, principal: str, title: str, args: AppArgs, options: SessionOptions, image: np.ndarray,
               context: Optional[np.ndarray] = None) -> Manifest:
        """A new world of a session opened with `options` on a server run with `args`."""
        manifest = new_manifest(principal_dir(principal), title, args, options, self._clock())
        parts = {IMAGE: encode_array(image)}
        if context is not None:
            parts[CONTEXT] = encode_array(context)
        return self._commit(principal, manifest, parts)

    def _commit(self, principal: str, manifest: Manifest, parts: dict[str, bytes], replaced: int = 0) -> Manifest:
        """Write `parts`, then the manifest (counting the world's bytes, itself included);
        `replaced`: bytes in the store that these writes replace."""
        body = sum(len(d) for d in parts.values())
        draft = replace(manifest, bytes=manifest.bytes + body)
        size = len(draft.to_json())
        manifest = replace(draft, bytes=draft.bytes + size)
        while len(manifest.to_json()) != size:  # the count's own digits
            size = len(manifest.to_json())
            manifest = replace(draft, bytes=draft.bytes + size)
        self._write(principal, manifest.world_id, {**parts, MANIFEST: manifest.to_json()}, replaced)
        return manifest

    def now(self) -> float:
        return self._clock()

    def put_world(self, principal: str, manifest: Manifest, parts: dict[str, bytes]) -> Manifest:
        """A whole world at once (an import: `manifest` with a new id and this owner, `parts`
        checked): quota first, the parts, the manifest last; a write that fails removes the
        world's objects again, so it is all there or not at all."""
        try:
            return self._commit(principal, manifest, parts)
        except QuotaExceeded:
            raise
        except BaseException:
            try:
                self.store.delete_prefix(world_dir(principal, manifest.world_id))
            except WorldError:  # the store went away: the parts stay unlisted (no manifest)
                pass
            with self._lock:
                self._usage.pop(principal_dir(principal), None)
            raise

    def set_context(self, principal: str, world_id: str, context: np.ndarray) -> Manifest:
        """The opening prompt's encoding (the journal's `context`), once the text encoder answered."""
        m = self.manifest(principal, world_id)
        return self._write_manifest(principal, m, {CONTEXT: encode_array(context)}, m.chunks, "")

    def put_chunk(self, principal: str, world_id: str, record: ChunkRecord,
                  previous_y: Optional[np.ndarray] = None) -> Manifest:
        """Chunk `record.index`, which makes the world `index + 1` chunks long: the next chunk,
        a retry of the last one, or an earlier one (a rewound session's new branch: the chunks
        after it are another branch's and are deleted after the manifest says so). Chunks come
        in order (at most the manifest's count). `previous_y`: the previous chunk's y."""
        m = self.manifest(principal, world_id)
        if record.index > m.chunks:
            raise ValueError(f"chunk {record.index} of a world of {m.chunks} chunks: chunks come in order")
        prefix = world_dir(principal, world_id)
        stale = []
        if record.index + 1 < m.chunks:
            stale = [o for o in self.store.list(f"{prefix}/c")
                     if int(o.key[len(prefix) + 3:].split("/")[0]) > record.index]
        parts = chunk_parts(record, previous_y)
        parts = {f"{chunk_dir(record.index)}/{name}": d for name, d in parts.items()}
        out = self._write_manifest(principal, m, parts, record.index + 1, chunk_dir(record.index),
                                   sum(o.size for o in stale))
        if stale:
            for o in sorted(stale, key=lambda o: not o.key.endswith(COMMIT)):  # commit records first
                self.store.delete(o.key)
            with self._lock:
                self._usage.pop(principal_dir(principal), None)  # counted afresh
        return out

    def _write_manifest(self, principal: str, m: Manifest, parts: dict[str, bytes], chunks: int,
                        under: str, dropped: int = 0) -> Manifest:
        """`parts` and the manifest updated (chunk count, time, bytes: the old manifest, what
        `parts` replaces and the `dropped` bytes of deleted chunks taken off)."""
        replaced = self._sizes(principal, m.world_id, parts, under)
        base = replace(m, chunks=chunks, updated=self._clock(),
                       bytes=m.bytes - len(m.to_json()) - replaced - dropped)
        return self._commit(principal, base, parts, replaced + len(m.to_json()))

    def _sizes(self, principal: str, world_id: str, parts: dict[str, bytes], under: str) -> int:
        """Bytes of the objects under `under` (a chunk's folder, or the world's) that `parts`
        replaces: a retried chunk, a second context, parts a failed write left."""
        prefix = world_dir(principal, world_id)
        return sum(o.size for o in self.store.list(f"{prefix}/{under}" if under else prefix)
                   if o.key[len(prefix) + 1:] in parts)

    def manifest(self, principal: str, world_id: str) -> Manifest:
        return Manifest.from_json(self.store.get(self._key(principal, check_world_id(world_id), MANIFEST)))

    def list(self, principal: str) -> list[Manifest]:
        """The principal's worlds (only its own: its digest's prefix), newest update first."""
        owner = principal_dir(principal)
        out = []
        for o in self.store.list(owner):
            if o.key.endswith("/" + MANIFEST) and o.key.count("/") == 4:
                try:
                    out.append(Manifest.from_json(self.store.get(o.key)))
                except (WorldNotFound, BadWorldFile):
                    continue  # deleted meanwhile, or damaged: not listed
        return sorted(out, key=lambda m: -m.updated)

    def load(self, principal: str, world_id: str) -> World:
        """The whole world, every part checked: the manifest's count of chunks, in order
        (BadWorldFile if one is not committed or a part does not match its commit record)."""
        m = self.manifest(principal, world_id)
        prefix = world_dir(principal, world_id)
        keys = {o.key[len(prefix) + 1:] for o in self.store.list(prefix)}

        def part(name: str) -> bytes:
            try:
                return self.store.get(f"{prefix}/{name}")
            except WorldNotFound:  # listed or committed, then gone: the world is damaged
                raise BadWorldFile(f"the world's part {name} is missing") from None

        image = decode_array(part(IMAGE))
        context = decode_array(part(CONTEXT)) if CONTEXT in keys else None
        chunks: list[ChunkRecord] = []
        while len(chunks) < m.chunks and f"{chunk_dir(len(chunks))}/{COMMIT}" in keys:
            k = len(chunks)
            meta = read_commit(part(f"{chunk_dir(k)}/{COMMIT}"), k)
            parts = {n: part(f"{chunk_dir(k)}/{n}") for n in meta["parts"]}
            chunks.append(chunk_from_parts(meta, parts, chunks[-1].past.y if chunks else None))
        if len(chunks) < m.chunks:
            raise BadWorldFile(f"the world has {m.chunks} chunks; {len(chunks)} are committed in the store")
        return World(m, image, context, chunks)

    def chunk_latents(self, principal: str, world_id: str, k: int) -> np.ndarray:
        """Chunk k's clean latents, checked against its commit record (a spilled journal's read,
        deployments/worlds/journal_spill.py); WorldNotFound where it is not committed."""
        where = f"{world_dir(principal, check_world_id(world_id))}/{chunk_dir(k)}"
        meta = read_commit(self.store.get(f"{where}/{COMMIT}"), k)
        want, data = meta["parts"]["latents.npy"], self.store.get(f"{where}/latents.npy")
        if len(data) != want["size"] or sha256(data) != want["sha256"]:
            raise BadWorldFile(f"chunk {k}: its latents do not match their checksum")
        return decode_array(data)

    def delete(self, principal: str, world_id: str) -> None:
        """The world and everything in it (the manifest first: it is no longer listed); a
        damaged world too."""
        self.store.get(self._key(principal, check_world_id(world_id), MANIFEST))  # world_not_found first
        self.store.delete(self._key(principal, world_id, MANIFEST))
        self.store.delete_prefix(world_dir(principal, world_id))
        with self._lock:
            self._usage.pop(principal_dir(principal), None)

    def sweep(self) -> list[str]:
        """Delete every world not updated for `retention_s` (None: none); their store dirs."""
        if self.retention_s is None:
            return []
        cutoff, gone = self._clock() - self.retention_s, []
        for o in self.store.list("p"):
            if not (o.key.endswith("/" + MANIFEST) and o.key.count("/") == 4):
                continue
            try:
                m = Manifest.from_json(self.store.get(o.key))
            except (WorldNotFound, BadWorldFile):
                continue
            if m.updated < cutoff:
                where = o.key.rsplit("/", 1)[0]
                self.store.delete(o.key)
                self.store.delete_prefix(where)
                gone.append(where)
                with self._lock:
                    self._usage.pop(where.split("/w/")[0], None)
        return gone
