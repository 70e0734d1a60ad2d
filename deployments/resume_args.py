"""`sessions.resume`: resume after a dropped socket (deployments/ingress/parking.py, resume.py).

Kept beside deployments/config.py, which nests it in `SessionArgs`; a serve config that still
writes the former flat keys (`sessions.resume_grace_s`, ...) is told where each one moved.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ResumeArgs(BaseModel):
    """A session whose socket dropped stays resumable `grace_s` (its replica state held, its
    journal parked); 0 ends sessions with their socket. The parking holds at most
    `max_sessions` sessions and `max_mib` of journals and replies; a session beyond either ends
    with its socket. Each parked session keeps its last `replay_chunks` sent replies, sent again
    to a client that missed them. One client (API key, or address without auth) parks at most
    `max_per_client` sessions (its oldest goes). Failed resume claims cost their client: beyond
    `failed_claims_burst`, its claims wait in the ingress (`failed_claims_per_minute`), or get
    `busy` (claim_gate.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grace_s: float = Field(60.0, ge=0)
    max_sessions: int = Field(256, ge=1)
    max_mib: float = Field(2048.0, gt=0)
    replay_chunks: int = Field(4, ge=0)
    max_per_client: int = Field(4, ge=1)
    failed_claims_per_minute: float = Field(12.0, gt=0)
    failed_claims_burst: int = Field(6, ge=1)


def moved_resume_keys(sessions: object) -> None:
    """Refuse the former flat `sessions.resume_*` keys, naming where each one is now."""
    if not isinstance(sessions, dict):
        return
    flat = sorted(k for k in sessions if isinstance(k, str) and k.startswith("resume_")
                  and k.removeprefix("resume_") in ResumeArgs.model_fields)
    if flat:
        moved = ", ".join(f"sessions.{k} -> sessions.resume.{k.removeprefix('resume_')}" for k in flat)
        raise ValueError(f"the resume settings moved into sessions.resume: {moved}")
