"""A small journal of three chunks as a session makes it (shared y, a prompt update, an FP8
growth record), and that journal saved as a world, for the world store's tests."""
from __future__ import annotations

import threading

import numpy as np

from deployments.config import AppArgs
from deployments.ingress.journal import SessionJournal
from deployments.wire import NoiseSnapshot, SessionOptions
from deployments.worlds.errors import StoreUnavailable
from deployments.worlds.journal_parts import journal_records
from deployments.worlds.local import LocalStore
from deployments.worlds.worlds import Worlds

OPTIONS = SessionOptions(session_id="s1", prompt="a quiet lake", image_digest="d", resolution=(32, 48), seed=7,
                         total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))


def make_journal(chunks: int = 3, seed: int = 0) -> SessionJournal:
    rng = np.random.default_rng(seed)
    journal = SessionJournal(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8), 1 << 30)
    journal.set_context(rng.standard_normal((6, 8)).astype(np.float32))
    y = rng.standard_normal((20, 3, 4, 6)).astype(np.float32)
    for k in range(chunks):
        if k < 2:  # from chunk 2 on, y stays the same (zero frames through the causal encoder)
            y = rng.standard_normal((20, 3, 4, 6)).astype(np.float32)
        context = None
        if k == 1:
            journal.steer(1, "the lake freezes")
            context = rng.standard_normal((5, 8)).astype(np.float32)
        growth = rng.standard_normal((2, 5, 3, 4)).astype(np.float32) if k == 2 else None
        poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
        poses[:, 0, 3] = k + np.arange(12) / 12
        journal.add_chunk(poses, np.full((12, 4), 0.5 + k, np.float32), y.copy() if k == 2 else y,
                          rng.standard_normal((16, 3, 4, 6)).astype(np.float32),
                          NoiseSnapshot(rng.integers(0, 255, 5056, dtype=np.uint8), False), context, growth)
    journal.conditioned = journal.decoded = chunks
    return journal


VIDEOS = [b"\x00\x00\x00\x18ftypiso5 init+moof0", b"moof1", None]


def save(worlds: Worlds, principal: str = "alice", chunks: int = 3, title: str = "lake"):
    journal = make_journal(chunks)
    m = worlds.create(principal, title, AppArgs(), OPTIONS, journal.image, journal.context)
    previous = None
    for record in journal_records(journal, videos=VIDEOS[:chunks]):
        m = worlds.put_chunk(principal, m.world_id, record, previous)
        previous = record.past.y
    return journal, m


class Switchable(LocalStore):
    """A local store that can be taken down (every call StoreUnavailable) or held (puts wait)."""

    down = False
    hold: threading.Event | None = None

    def _check(self):
        if self.down:
            raise StoreUnavailable("test: the store is down")

    def _put(self, key, data):
        self._check()
        if self.hold is not None:
            self.hold.wait(10)
        super()._put(key, data)

    def _get(self, key):
        self._check()
        return super()._get(key)

    def _list(self, prefix):
        self._check()
        return super()._list(prefix)
