"""World changed: a world (or a session kept in the store) made by another model setup than
the one served now, said field by field (`model.dtype: 'bfloat16' -> 'float32'`), with the world
to `reopen` (reopen.py) and the changed fields on the `world_changed` error (PROTOCOL.md).
The fields are the fingerprint's (deployments/worlds/manifest.py `fingerprint_changes`)."""
from __future__ import annotations

from typing import Any, Optional

from deployments.errors import WorldChanged
from deployments.worlds.manifest import fingerprint_changes
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply

_MISSING = object()


def _value(fields: dict[str, Any], dotted: str) -> Any:
    at: Any = fields
    for name in dotted.split("."):
        if not isinstance(at, dict) or name not in at:
            return _MISSING
        at = at[name]
    return at


def _shown(v: Any) -> str:
    return "unset" if v is _MISSING else f"{v!r:.40}"


def describe_changes(stored: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], str]:
    """The changed fields' names and, for people, each with its value then and now
    (`model.dtype: 'bfloat16' -> 'float32'`)."""
    names = fingerprint_changes(stored, current)
    return names, "; ".join(f"{n}: {_shown(_value(stored, n))} -> {_shown(_value(current, n))}" for n in names)


def world_changed(world_id: str, stored: dict[str, Any], current: dict[str, Any], what: str) -> Optional[WorldChanged]:
    """The `world_changed` error of `what` (a session, a world) made by the `stored` model setup,
    or None when it is the `current` one."""
    names, said = describe_changes(stored, current)
    if not names:
        return None
    return WorldChanged(f"{what} was made by another model setup than the one served now ({said}): it cannot "
                        f"continue byte-identical; `reopen` with world_id {world_id} runs its inputs again through "
                        "the served model as a new session (new chunks)", world_id, tuple(names))


def with_world(reply: ErrorReply, error: BaseException) -> ErrorReply:
    """`reply` with the world to reopen and the changed fields, where `error` is `world_changed`."""
    if not isinstance(error, WorldChanged) or reply.code is not ErrorCode.WORLD_CHANGED:
        return reply
    return reply.model_copy(update={"world_id": error.world_id, "changed": list(error.changed)})
