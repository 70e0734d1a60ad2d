"""Chunks of a watched world into one MP4 whose timeline runs from 0 without a gap (no PyAV).

A viewer of a shared world gets the owner's fMP4 chunks from wherever it joined: the first one
with the init segment in front, each with its own decode time (`tfdt`) on the owner's timeline.
Concatenated as they came, a late join starts late, a skipped chunk leaves a hole and the owner's
Undo sends the timeline back. `Retimer` rewrites each fragment's `tfdt` (and its `mfhd` sequence
number) so that the chunks play back to back, in the order they came: the bytes keep their
sizes, so nothing else in them moves.
"""
from __future__ import annotations

import struct

from media.fragment_check import _boxes

_TRUN_DURATION = 0x000100  # trun flag: a duration per sample
_TFHD_DEFAULT_DURATION = 0x000008  # tfhd flag: default-sample-duration present


class Retimer:
    """Rewrites the fragments of a chunk stream in order (module doc)."""

    def __init__(self) -> None:
        self.decode_time = 0  # where the next fragment starts, in the track's timescale
        self.sequence = 0
        self.default_duration = 0  # the init segment's trex default, for a trun without durations

    def __call__(self, payload: bytes) -> bytes:
        """One chunk's payload (init segment first, or not) with its fragments moved to follow
        the last one's; ValueError for a payload that is not fMP4 (media/fragment_check.py)."""
        data = bytearray(payload)
        for kind, start, end in _boxes(data, 0, len(data)):
            if kind == b"moov":
                self._trex(data, start, end)
            elif kind == b"moof":
                self._moof(data, start, end)
        return bytes(data)

    def _trex(self, data: bytearray, start: int, end: int) -> None:
        for kind, s, e in _boxes(data, start, end):
            if kind == b"mvex":
                for inner, s2, _ in _boxes(data, s, e):
                    if inner == b"trex":  # version/flags, track_ID, default_sample_description_index, duration
                        self.default_duration = struct.unpack_from(">I", data, s2 + 12)[0]

    def _moof(self, data: bytearray, start: int, end: int) -> None:
        duration = 0
        for kind, s, e in _boxes(data, start, end):
            if kind == b"mfhd":
                self.sequence += 1
                struct.pack_into(">I", data, s + 4, self.sequence)
            elif kind == b"traf":
                duration = max(duration, self._traf(data, s, e))
        self.decode_time += duration

    def _traf(self, data: bytearray, start: int, end: int) -> int:
        """Set the traf's tfdt to the stream's time; its samples' total duration."""
        default, tfdt, total = self.default_duration, None, 0
        for kind, s, e in _boxes(data, start, end):
            flags = int.from_bytes(data[s + 1:s + 4], "big")
            if kind == b"tfhd" and flags & _TFHD_DEFAULT_DURATION:
                offset = s + 8 + (8 if flags & 0x000001 else 0) + (4 if flags & 0x000002 else 0)
                default = struct.unpack_from(">I", data, offset)[0]
            elif kind == b"tfdt":
                tfdt = s
            elif kind == b"trun":
                total += _trun_duration(data, s, flags, default)
        if tfdt is None:
            raise ValueError("a fragment without its decode time (tfdt)")
        if data[tfdt] == 1:
            struct.pack_into(">Q", data, tfdt + 4, self.decode_time)
        else:
            struct.pack_into(">I", data, tfdt + 4, self.decode_time & 0xFFFFFFFF)
        return total


def _trun_duration(data: bytearray, start: int, flags: int, default: int) -> int:
    count = struct.unpack_from(">I", data, start + 4)[0]
    if not flags & _TRUN_DURATION:
        return count * default
    pos = start + 8 + (4 if flags & 0x000001 else 0) + (4 if flags & 0x000004 else 0)
    per_sample = 4 * sum(1 for bit in (0x000100, 0x000200, 0x000400, 0x000800) if flags & bit)
    return sum(struct.unpack_from(">I", data, pos + i * per_sample)[0] for i in range(count))
