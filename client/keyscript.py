"""Key scripts: `w:3,j:2,none:1` -> the key states a scripted drive holds, and for how many chunks.

An entry is `KEYS:CHUNKS`: KEYS are key names joined by `+` (`w+j`: forward while turning
left), any case, `none` (or nothing before the colon) for no key held; CHUNKS >= 1 is how many
chunks that state is held for. The key names are those of `control` (camera/keys.py: w a s d
q e, i j k l, arrowup ...). Entries are separated by commas.
"""
from __future__ import annotations

from dataclasses import dataclass

from camera.keys import KEY_NAMES

NO_KEYS = "none"


@dataclass(frozen=True, slots=True)
class KeyState:
    """Keys held (canonical order, lower case) for `chunks` consecutive chunks."""

    keys: tuple[str, ...]
    chunks: int


def parse_keyscript(text: str) -> list[KeyState]:
    """`w:3,j+w:2,none:1` -> [KeyState]; ValueError saying what is wrong with which entry."""
    if not text.strip():
        raise ValueError("the key script is empty: give entries KEYS:CHUNKS, e.g. w:3,j:2,none:1")
    states = []
    for i, entry in enumerate(text.split(","), 1):
        keys_part, sep, count = entry.strip().rpartition(":")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"key script entry {i} ({entry.strip()!r}): expected KEYS:CHUNKS with CHUNKS >= 1")
        names = {k.strip().lower() for k in keys_part.split("+")} - {"", NO_KEYS}
        unknown = sorted(names - set(KEY_NAMES))
        if unknown:
            raise ValueError(f"key script entry {i} ({entry.strip()!r}): unknown key(s) {', '.join(unknown)}; "
                             f"the keys are {', '.join(KEY_NAMES)} (or {NO_KEYS})")
        states.append(KeyState(tuple(k for k in KEY_NAMES if k in names), int(count)))
    return states


def chunk_keys(states: list[KeyState]) -> list[tuple[str, ...]]:
    """The keys held for each chunk, in order (one entry per chunk)."""
    return [s.keys for s in states for _ in range(s.chunks)]
