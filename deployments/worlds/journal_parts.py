"""A session's journal (deployments/ingress/journal.py) as a world's stored parts, and back.

What the journal keeps is what a world stores: the image, the opening prompt's encoding, and
per chunk its PastChunk (camera as received, y, clean latents, a prompt update's encoding, the
FP8 growth record) with the noise state after it and the prompt update's text. A journal made
back from a world is the journal of a session that made those chunks (every chunk conditioned
and decoded), so a rebuild (deployments/ingress/history/rebuild.py: the DiT's `restore`, the
VAE's replay) continues it. This module stands on the journal's floor (tests/test_imports.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

from deployments.ingress.journal import SessionJournal
from deployments.worlds.journal_spill import SpillSource
from deployments.worlds.chunks import ChunkRecord
from deployments.worlds.worlds import World


def journal_records(journal: SessionJournal, first: int = 0,
                    videos: Optional[Sequence[Optional[bytes]]] = None) -> list[ChunkRecord]:
    """Chunks `first`.. of a recoverable journal as records (`videos[k - first]`: chunk k's fMP4
    bytes as sent, where the caller has them)."""
    if not journal.recoverable:
        raise ValueError("the journal is over its budget: it holds no chunks")
    out = []
    for k in range(first, len(journal.chunks)):
        video = videos[k - first] if videos is not None else None
        out.append(ChunkRecord(k, journal.chunks[k], journal.noises[k], journal.steering.get(k), video))
    return out


def journal_from_world(world: World, max_bytes: Optional[int],
                       spill: Optional[SpillSource] = None) -> SessionJournal:
    """A journal of the world's chunks, as the session had it after its last chunk; `max_bytes`:
    the session's journal budget (a world larger than it gives a journal that is not
    recoverable, as a live session's would be, unless `spill`: the world they came from, where
    the journal over its budget leaves them, deployments/worlds/journal_spill.py)."""
    journal = SessionJournal(world.image, max_bytes)
    if spill is not None:
        journal.spill_to(spill)
    if world.context is not None:
        journal.set_context(world.context)
    for record in world.chunks:
        if record.prompt is not None:
            journal.steer(record.index, record.prompt)
        p = record.past
        journal.add_chunk(p.poses, p.intrinsics, p.y, p.latents, record.noise, p.context, p.kv_growth)
        if spill is not None and journal.recoverable:
            journal.in_store(record.index, journal.chunks[record.index], spill)
    journal.conditioned = journal.decoded = len(world.chunks)
    return journal
