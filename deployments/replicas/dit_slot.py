"""A DiT replica's record of one session (`DiTSlot`) and what admitting one takes (`AdmissionPlan`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from model.engine_api import SessionFootprint
from model.session import DiTSession


@dataclass(slots=True)
class DiTSlot:
    session: DiTSession
    height: int
    width: int
    kv_frames: int  # latent frames the reservation covers
    chunks: int = 0
    windowed: bool = False  # the session runs with the rolling window: its memory never grows
    update_s: float = 0.0  # its last chunk's deferred cache update (reported with the next chunk)
    preempt_chunk: Optional[int] = None  # `preempt`: give this chunk up at its next denoising call


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """What admitting one session takes, from its size and length alone (not its prompt)."""

    full_attention: bool
    kv_frames: int  # latent frames the reservation covers
    windowed: bool
    need: SessionFootprint
    offline: bool  # a `/v1/videos` job's: counted against max_offline_sessions, not the floor
    bucket: tuple[int, int, bool]  # (height, width, windowed): its step times' (frame_floor.py)
