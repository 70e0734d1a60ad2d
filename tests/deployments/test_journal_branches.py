"""SessionJournal prefixes (issue 33): a truncated or copied prefix is the journal of the session
as it was after that many chunks (noise state, prompt, counters, bytes), arrays shared."""
from __future__ import annotations

import numpy as np

from deployments.ingress.journal import SessionJournal
from deployments.wire import NoiseSnapshot

IMAGE = np.zeros((8, 8, 3), np.uint8)


def _journal(chunks: int) -> SessionJournal:
    j = SessionJournal(IMAGE, 1 << 30)
    j.set_context(np.ones((4, 8), np.float32))
    y = np.ones((20, 3, 2, 2), np.float32)
    for k in range(chunks):
        if k == 2:
            j.steer(2, "steered")
        j.add_chunk(np.full((12, 4, 4), k, np.float32), np.ones((12, 4), np.float32), y,
                    np.full((16, 3, 2, 2), k, np.float32), NoiseSnapshot(np.full(16, k, np.uint8), False),
                    np.zeros((4, 8), np.float32) if k == 2 else None)
        j.conditioned += 1
        j.decoded += 1
    return j


def test_prefix_is_the_journal_after_k_chunks_and_leaves_the_original():
    j = _journal(4)
    before = (len(j.chunks), j.noise, j.nbytes)
    p = j.prefix(2)
    assert (len(p.chunks), p.conditioned, p.decoded) == (2, 2, 2)
    assert p.noise is j.noises[1] and p.prompt_after(2, "opened") == "opened"
    assert p.chunks[1].latents is j.chunks[1].latents  # shared, not copied
    assert p.nbytes == _journal(2).nbytes < j.nbytes
    assert (len(j.chunks), j.noise, j.nbytes) == before and j.prompt_after(4, "opened") == "steered"
    assert j.prefix(0).noise is None and j.prefix(0).decoded_latents() == []


def test_truncate_drops_later_prompt_updates():
    j = _journal(4)
    j.truncate(3)
    assert j.prompt_after(3, "opened") == "steered" and j.noise is j.noises[2]
    j.truncate(2)
    assert j.steering == {} and j.prompt_after(2, "opened") == "opened" and j.nbytes == _journal(2).nbytes
