"""The requests a client sends, built as the wire's models (`protocol.messages`) from typed
arguments; `protocol.codec.encode` packs them. A bad value fails here with the `ProtocolError`
code the server would answer. The client builds them, and so does the server where it is a
client of itself (the peers mode, `/v1/videos`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from camera.plan import SessionPlan
from protocol.codec import validated
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import DriveRequest, InferRequest


@dataclass(frozen=True, slots=True)
class SessionStart:
    """What a session's first request declares (PROTOCOL.md §2): the start image (PNG/JPEG bytes
    or RGB uint8 [H, W, 3]) and prompt, and the session's options (None: the server's default)."""

    image: bytes | np.ndarray
    prompt: str
    seed: Optional[int] = None
    size: Optional[str] = None  # max output area "H*W"
    num_frames: Optional[int] = None  # None: open-ended
    translation_scale: Optional[float] = None
    intrinsics_resolution: Optional[tuple[int, int]] = None
    prefix_cache: Optional[bool] = None  # False keeps the session out of the server's prefix store

    def fields(self) -> dict:
        """The wire fields (NumPy scalars as the Python numbers the strict fields take)."""
        out = {f: getattr(self, f) for f in self.__slots__}
        out.update(seed=_int(self.seed), num_frames=_int(self.num_frames),
                   translation_scale=None if self.translation_scale is None else float(self.translation_scale))
        return out


def _int(v: Optional[int]) -> Optional[int]:
    return None if v is None else int(v)


def infer_request(session_id: str, poses: Optional[np.ndarray] = None, intrinsics: Optional[np.ndarray] = None, *,
                  start: Optional[SessionStart] = None, from_keys: bool = False, prompt: Optional[str] = None,
                  prompt_update: Optional[str] = None, client_chunk_id: Optional[int] = None,
                  resume_token: Optional[str] = None, resume_from: Optional[int] = None,
                  limits: Limits = DEFAULT_LIMITS) -> InferRequest:
    """One chunk's infer: its cameras (poses [N, 4, 4], intrinsics [N, 4]), or `from_keys` (the
    keys held move the camera); `start` on a session's first; `prompt` on a later one: the
    session's prompt as the client has it (a changed one without `prompt_update` starts a fresh
    session); `resume_token` (and `resume_from`) on the infer that continues a session whose
    socket dropped."""
    if (poses is None) != (intrinsics is None):
        raise ValueError("give poses and intrinsics together")
    if start is not None and prompt is not None:
        raise ValueError("a session's first infer declares its prompt in `start`")
    fields = {"session_id": session_id, "from_keys": from_keys or None, "prompt": prompt, "prompt_update": prompt_update,
              "client_chunk_id": _int(client_chunk_id), "resume_token": resume_token, "resume_from": _int(resume_from),
              "cameras": None if poses is None else {"poses": poses, "intrinsics": intrinsics},
              **(start.fields() if start is not None else {})}
    return validated(InferRequest, fields, limits)


def drive_request(session_id: str, start: SessionStart, limits: Limits = DEFAULT_LIMITS) -> DriveRequest:
    """A session the server runs by itself from the keys held (PROTOCOL.md, `drive`)."""
    fields = start.fields()
    if fields.pop("prefix_cache") is not None:
        raise ValueError("a driven session has no prefix_cache option")
    return validated(DriveRequest, {"session_id": session_id, **fields}, limits)


def plan_requests(plan: SessionPlan, session_id: str, start: SessionStart, *,
                  prompt_schedule: Optional[dict[int, str]] = None, open_ended: bool = False,
                  limits: Limits = DEFAULT_LIMITS) -> list[InferRequest]:
    """The infers of a planned session (`camera.plan_session`), in order.

    The first carries `start` with the plan's `num_frames` and `translation_scale`: the session
    then reproduces the offline run (PROTOCOL.md §2). `prompt_schedule` {chunk: prompt} (chunks
    >= 1): `prompt_update` on those chunks' infers (prompt steering; the offline equivalent is
    `WorldPipeline.generate(prompt_schedule=...)`). `open_ended`: declare no `num_frames` (an
    open-ended session: per-chunk noise, and the server's rolling window where it has one), as an
    interactive client that does not know its length.
    """
    schedule = dict(prompt_schedule or {})
    if any(not 1 <= c < len(plan.chunk_poses) for c in schedule):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"prompt_schedule chunks must be in 1..{len(plan.chunk_poses) - 1}")
    first = replace(start, num_frames=None if open_ended else plan.num_frames, translation_scale=plan.translation_scale)
    return [infer_request(session_id, poses, plan.chunk_intrinsics(k), start=None if k else first,
                          prompt_update=schedule.get(k), client_chunk_id=k, limits=limits)
            for k, poses in enumerate(plan.chunk_poses)]
