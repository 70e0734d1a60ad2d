"""SessionJournal: what the ingress keeps of one session to rebuild it on another replica.

A session's replica state (DiT KV caches, VAE causal caches, muxer) is large and lives in one
replica; what produced it is small and is kept here, beside the connection: the image and
text context, and per finished chunk the camera payload as received, its conditioning y and
its clean latents (and the text context of a prompt update made before it), plus the noise generator's state after the last chunk. When a replica dies
or drops the session, the DiT replays one cache-update call per past chunk and the VAE
replays its conditions and decodes (`DiTDeployment.restore`, `VaeDeployment.restore`); the session then
continues exactly as if nothing had happened.

The journal also keeps the noise state after every chunk and the prompt updates by chunk, so
that a prefix of it is the journal of the session as it was after that many chunks: a rewind
truncates it and a fork copies a prefix (branching.py); the rebuild is the same.

Consecutive chunks' y converge to one value (zero frames through the causal encoder), so
equal y are stored once. A journal that outgrows its byte budget drops its contents: the
session can no longer be recovered and a lost replica then means `session_lost`; unless it
spills (deployments/worlds/journal_spill.py): where the session's world is kept in the world
store, the clean latents of the chunks the store has are let go from memory instead, and read
back from the store when a rebuild needs them (`full_chunks`, `full_decoded_latents`).
"""
from __future__ import annotations

import copy
from typing import Optional

import numpy as np

from deployments.worlds.journal_spill import Spill, SpillSource
from deployments.wire import NoiseSnapshot, PastChunk


class SessionJournal:
    """Inputs and results of one session so far; `recoverable` while within its budget."""

    def __init__(self, image: np.ndarray, max_bytes: Optional[int]) -> None:
        """`image`: RGB uint8 [H0, W0, 3]; `max_bytes` None turns recovery off."""
        self.image: Optional[np.ndarray] = image
        self.context: Optional[np.ndarray] = None  # [L, text_dim] once the prompt is encoded
        self.chunks: list[PastChunk] = []  # sent as they are to `DiTDeployment.restore`
        self.noise: Optional[NoiseSnapshot] = None  # after the last chunk
        self.noises: list[NoiseSnapshot] = []  # after each chunk (a prefix's `noise`)
        self.steering: dict[int, str] = {}  # chunk -> the prompt update made before it (a prefix's prompt)
        self.conditioned = 0  # condition calls the VAE answered (its encoder position)
        self.decoded = 0  # decode calls the VAE answered (its decoder and muxer position)
        # Where the replicas may keep the session's state after k chunks (deployments/replicas/
        # snapshots.py) when that state is not its own keys' (`Stream.snapshot_ids`): k -> (DiT
        # snapshot id, VAE snapshot id) of the session it was served from (the prefix store) or
        # copied from (a fork, a rewind). Filled only when the server keeps snapshots; kept
        # whatever the byte budget (ids, not arrays).
        self.snapshots: dict[int, tuple[str, str]] = {}
        self.text_encode_s = 0.0  # the prompt's encode when the session opened (chunk 0's timings)
        self.recoveries = 0  # times the session was rebuilt on another replica (recovery.py)
        self._max_bytes = max_bytes
        self._enabled = max_bytes is not None
        self.spill = Spill()  # the chunks whose latents live in the world store only (journal_spill.py)
        self.nbytes = image.nbytes
        if not self._enabled:
            self.image = None

    @property
    def recoverable(self) -> bool:
        return self._enabled

    def set_context(self, context: np.ndarray) -> None:
        self._keep(context.nbytes)
        if self._enabled:
            self.context = context

    def add_chunk(self, poses: np.ndarray, intrinsics: np.ndarray, y: np.ndarray, latents: np.ndarray,
                  noise: NoiseSnapshot, context: Optional[np.ndarray] = None,
                  kv_growth: Optional[np.ndarray] = None) -> None:
        """Record a finished chunk (in chunk order); `context`: the prompt update (prompt
        steering) applied before it, replayed at the same point by a rebuild; `kv_growth`: its
        FP8 code caches' growth record (deployments/wire.py PastChunk), redone by a rebuild."""
        previous = self.chunks[-1].y if self.chunks else None
        if previous is not None and previous.shape == y.shape and np.array_equal(previous, y):
            y = previous
        new_bytes = poses.nbytes + intrinsics.nbytes + latents.nbytes + (0 if y is previous else y.nbytes)
        new_bytes += (0 if context is None else context.nbytes) + noise.rng.nbytes
        new_bytes += 0 if kv_growth is None else kv_growth.nbytes
        if self._enabled:  # counted once held: a spill over the budget may let older chunks go
            self.chunks.append(PastChunk(poses, intrinsics, y, latents, context, kv_growth))
        self._keep(new_bytes)
        if self._enabled:
            self.noise = noise
            self.noises.append(noise)

    def would_keep(self, nbytes: int) -> bool:
        """`nbytes` more would stay within the budget (the journal stays recoverable)."""
        return self._enabled and self.nbytes + nbytes <= self._max_bytes

    def steer(self, chunk: int, prompt: str) -> None:
        """Chunk `chunk` (and the later ones) attend to `prompt` (a prompt update)."""
        if self._enabled:
            self.steering[chunk] = prompt

    def prompt_after(self, chunks: int, opened: str) -> str:
        """The prompt the session attended to after its first `chunks` chunks (`opened`: its first)."""
        steered = [c for c in self.steering if c < chunks]
        return self.steering[max(steered)] if steered else opened

    def opened(self, text_encode_s: float) -> None:
        """The DiT opened the session; its prompt took this long to encode."""
        self.text_encode_s = text_encode_s

    def recovered(self) -> None:
        """A replica lost the session and it was rebuilt on another (recovery.py)."""
        self.recoveries += 1

    def inherit_snapshots(self, ids: dict[int, tuple[str, str]]) -> None:
        """The snapshots of the session's first chunks are another session's (see `snapshots`)."""
        self.snapshots = dict(ids)

    def inherit_snapshot(self, chunks: int, ids: tuple[str, str]) -> None:
        """The session's state after `chunks` chunks is kept as `ids` (a chunk the store served)."""
        self.snapshots[chunks] = ids

    def truncate(self, chunks: int) -> None:
        """Keep the first `chunks` chunks: the journal of the session as it was after them
        (conditioned and decoded as many; no call of the session may be in flight)."""
        assert self._enabled and 0 <= chunks <= len(self.chunks), "truncate: not recoverable or out of range"
        self.chunks, self.noises = self.chunks[:chunks], self.noises[:chunks]
        self.noise = self.noises[-1] if chunks else None
        self.steering = {c: p for c, p in self.steering.items() if c < chunks}
        self.snapshots = {c: ids for c, ids in self.snapshots.items() if c <= chunks}
        self.spill = self.spill.prefix(chunks)
        self.conditioned = self.decoded = chunks
        self.nbytes = self._measure()

    def prefix(self, chunks: int) -> SessionJournal:
        """A new journal of the first `chunks` chunks (its arrays shared with this one: never
        written in place), for a forked session."""
        other = copy.copy(self)
        other.snapshots = {c: ids for c, ids in self.snapshots.items() if c <= chunks}
        other.text_encode_s, other.recoveries = 0.0, 0  # a new session: its own open and rebuilds
        other.spill = self.spill.prefix(chunks)  # its spilled chunks are read from this one's world
        if not self._enabled:  # nothing kept (a fork at the head copies the live session: branching.py)
            other.conditioned = other.decoded = chunks
            return other
        other.truncate(chunks)
        return other

    def _measure(self) -> int:
        """Bytes held (arrays shared between equal consecutive y counted once)."""
        seen: set[int] = set()
        total = 0
        for a in [self.image, self.context, *(x for c in self.chunks for x in (c.poses, c.intrinsics, c.y, c.latents,
                                                                               c.context)),
                  *(n.rng for n in self.noises)]:
            if a is not None and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total

    def decoded_latents(self) -> list[np.ndarray]:
        """Latents of the chunks the VAE has decoded, in order (to rebuild its decoder); None for
        a spilled chunk's (`full_decoded_latents` reads them back)."""
        assert self.decoded <= len(self.chunks), "a chunk was decoded before the journal saw it"
        return [c.latents for c in self.chunks[: self.decoded]]

    # ---- spilling to the world store (journal_spill.py) ----

    def spill_to(self, source: SpillSource) -> None:
        """From now on, over the budget, chunks the store confirms (`in_store`) may be let go."""
        self.spill.source = source

    def in_store(self, k: int, past: PastChunk, source: SpillSource) -> None:
        """Chunk k was written to `source`'s world as `past` (a chunk of another branch since,
        e.g. after a rewind, is not this one): older chunks may go while over budget."""
        if self._enabled and k < len(self.chunks) and self.chunks[k] is past:
            self.spill.stored[k] = source
            if self.nbytes > self._max_bytes:
                self.nbytes -= self.spill.let_go(self.chunks, self.nbytes - self._max_bytes)

    async def full_chunks(self) -> list[PastChunk]:
        """Every chunk with its latents (a spilled chunk's read back and checked); SessionLost
        when the store cannot give them."""
        return await self.spill.filled(self.chunks)

    async def full_decoded_latents(self) -> list[np.ndarray]:
        return [c.latents for c in (await self.full_chunks())[: self.decoded]]

    def _keep(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self._enabled and self.nbytes > self._max_bytes and self.spill.source is not None:
            self.nbytes -= self.spill.let_go(self.chunks, self.nbytes - self._max_bytes)
            if self.nbytes <= self.spill.hard_limit(self._max_bytes):
                return  # over the budget by chunks not in the store yet: they go once written
        if self._enabled and self.nbytes > self._max_bytes:
            self._enabled = False  # over budget: free everything, the session is no longer recoverable
            self.image, self.context, self.chunks, self.noise = None, None, [], None
            self.spill = Spill()
            self.noises, self.steering = [], {}
