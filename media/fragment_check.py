"""A frame reply's video checked as fragmented MP4 before a client keeps or writes it (no PyAV).

What the muxer (media/mp4_boxes.py) writes and PROTOCOL.md states: ISO-BMFF boxes that tile
the payload exactly; chunk 0 starts with the init segment (ftyp, moov); then one fragment or
more, each a moof (holding its mfhd and traf) followed by its mdat. Only the structure is
checked: bytes inside a well-formed mdat show what they are when decoded.
"""
from __future__ import annotations

from typing import Optional

FRAGMENT_EXTRAS = frozenset({b"styp", b"sidx", b"free", b"skip", b"emsg", b"prft"})  # allowed between fragments


def _boxes(data: bytes, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """(type, payload start, end) of the boxes that tile data[start:end]; ValueError otherwise."""
    out, pos = [], start
    while pos < end:
        if end - pos < 8:
            raise ValueError(f"{end - pos} stray bytes after the last box")
        size, kind, header = int.from_bytes(data[pos:pos + 4], "big"), bytes(data[pos + 4:pos + 8]), 8
        if size == 1:  # a 64-bit size follows the type
            if end - pos < 16:
                raise ValueError("a box's 64-bit size is cut off")
            size, header = int.from_bytes(data[pos + 8:pos + 16], "big"), 16
        elif size == 0:  # the box runs to the end
            size = end - pos
        if size < header or pos + size > end:
            raise ValueError(f"a box of {size} bytes at offset {pos - start} does not fit the {end - start} "
                             "bytes it is in")
        out.append((kind, pos + header, pos + size))
        pos += size
    return out


def _name(kind: bytes) -> str:
    return kind.decode("latin-1") if kind.isalnum() else repr(kind)


def fragment_problem(payload: bytes, first: bool) -> Optional[str]:
    """What is wrong with `payload` as a frame reply's video (`first`: the session's chunk 0,
    which must carry the init segment), or None when its structure is that of fMP4."""
    try:
        boxes = _boxes(payload, 0, len(payload))
    except ValueError as e:
        return f"not ISO-BMFF boxes: {e}"
    if not boxes:
        return "an empty video"
    kinds = [kind for kind, _, _ in boxes]
    if first and kinds[:2] != [b"ftyp", b"moov"]:
        return "chunk 0 does not start with the init segment (ftyp, moov)"
    if kinds[:1] == [b"ftyp"] and kinds[1:2] != [b"moov"]:
        return "an ftyp box without its moov"
    fragments = [(kind, start, end) for kind, start, end in boxes[2 if kinds[:1] == [b"ftyp"] else 0:]
                 if kind not in FRAGMENT_EXTRAS]
    if not fragments:
        return "no fragment (moof, mdat) after the init segment" if first else "no fragment (moof, mdat)"
    if len(fragments) % 2 or any(k != b"moof" for k, _, _ in fragments[::2]) \
            or any(k != b"mdat" for k, _, _ in fragments[1::2]):
        return "the fragments are not moof, mdat pairs (boxes: " + ", ".join(_name(k) for k in kinds[:12]) + ")"
    for _, start, end in fragments[::2]:
        try:
            inner = {kind for kind, _, _ in _boxes(payload, start, end)}
        except ValueError as e:
            return f"a moof's boxes: {e}"
        if not {b"mfhd", b"traf"} <= inner:
            return "a moof without its mfhd and traf"
    return None
