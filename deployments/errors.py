"""Typed errors that replicas raise and the ingress turns into `error` replies.

They cross process boundaries (Ray pickles them inside a `RayTaskError`), so each one
rebuilds itself from its own fields (`__reduce__`) and carries its wire `code`.
"""
from __future__ import annotations

from protocol.errors import ErrorCode


class ReplicaError(Exception):
    """Base class: an error a replica reports about one session."""

    code: ErrorCode

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.message,))


class SessionLost(ReplicaError):
    """The replica does not hold this session (never opened here, expired, closed, restarted)."""

    code = ErrorCode.SESSION_LOST


class NoSnapshot(ReplicaError):
    """The replica keeps no snapshot of that session after that chunk (none taken, evicted, of
    another replica): the ingress rebuilds from the journal instead (replicas/snapshots.py)."""

    code = ErrorCode.SESSION_LOST


class ChunkLimit(ReplicaError):
    """A rebuild of more chunks than the chunk cap allows (`sessions.max_chunks`)."""

    code = ErrorCode.TOO_LARGE


class AttentionBound(ReplicaError):
    """A session without a window whose next chunk would attend to more tokens than the
    server's bound (`sessions.max_attention_tokens`)."""

    code = ErrorCode.TOO_LARGE


class SessionLimit(ReplicaError):
    """The session produced `sessions.max_chunks` chunks (the RoPE table's 1024 latent frames)."""

    code = ErrorCode.SESSION_LIMIT


class WorldChanged(ReplicaError):
    """A session kept in the world store cannot continue byte-identical here: the model that
    made it differs from the one served (deployments/ingress/worlds/revive.py names the fields)."""

    code = ErrorCode.WORLD_CHANGED

    def __init__(self, message: str, world_id: str | None = None, changed: tuple[str, ...] = ()) -> None:
        """`world_id`: the world a `reopen` runs again; `changed`: the fields that differ."""
        super().__init__(message)
        self.world_id = world_id
        self.changed = tuple(changed)

    def __reduce__(self):
        return (type(self), (self.message, self.world_id, self.changed))


class Unsupported(ReplicaError):
    """A request this deployment cannot serve (e.g. prompt steering on a sharded DiT)."""

    code = ErrorCode.BAD_MESSAGE


class TooLarge(ReplicaError):
    """The session can never fit this replica (its memory or work bounds), whatever else it holds."""

    code = ErrorCode.TOO_LARGE


class Busy(ReplicaError):
    """No capacity for a new session now; `retry_after_s` says when to try again; `ends_needed`:
    how many of the refusing replica's sessions must end before a new one fits there (the
    waiting room's ETAs: 1 for a slot or bytes, more when the frame-rate floor binds)."""

    code = ErrorCode.BUSY

    def __init__(self, message: str, retry_after_s: float, ends_needed: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.ends_needed = ends_needed

    def __reduce__(self):
        return (type(self), (self.message, self.retry_after_s, self.ends_needed))



class Preempted(ReplicaError):
    """A driven session's chunk given up between its denoising calls (`DiTDeployment.preempt`:
    its keys changed while it ran); the session is as before it, the ingress makes it again."""

    code = ErrorCode.BUSY


class Unauthorized(ReplicaError):
    """A resume whose token (or API key) is not the session's."""

    code = ErrorCode.UNAUTHORIZED
