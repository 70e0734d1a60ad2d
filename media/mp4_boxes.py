"""ISO-BMFF boxes for fragmented MP4 with one H.264 video track (ISO/IEC 14496-12).

`init_segment` is ftyp + moov (empty sample tables, mvex/trex); each `fragment` is
moof (mfhd, traf: tfhd with default-base-is-moof, tfdt, trun) + mdat.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

TRACK_ID = 1
_MATRIX = struct.pack(">9i", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)  # identity
_SYNC_FLAGS = 0x02000000  # sample_depends_on = 2 (depends on no other sample)
_NON_SYNC_FLAGS = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample = 1
_TFHD_DEFAULT_BASE_IS_MOOF = 0x020000
_TRUN_FLAGS = 0x000001 | 0x000100 | 0x000200 | 0x000400  # data offset + per-sample duration/size/flags


def box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    assert len(kind) == 4 and len(payload) + 8 < 2**32
    return struct.pack(">I", len(payload) + 8) + kind + payload


def full_box(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return box(kind, struct.pack(">I", (version << 24) | flags), *parts)


def _avc1(width: int, height: int, avcc: bytes) -> bytes:
    return box(b"avc1", b"\x00" * 6, struct.pack(">H", 1),  # reserved, data_reference_index
               b"\x00" * 16,  # pre_defined, reserved, pre_defined[3]
               struct.pack(">HHIIIH", width, height, 0x00480000, 0x00480000, 0, 1),  # 72 dpi, 1 frame
               b"\x00" * 32,  # compressorname (empty)
               struct.pack(">Hh", 0x0018, -1),  # depth 24, pre_defined
               box(b"avcC", avcc))


def init_segment(width: int, height: int, timescale: int, sample_duration: int, avcc: bytes) -> bytes:
    """ftyp + moov for one video track whose samples all come in fragments."""
    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isom", b"iso5", b"avc1", b"mp41")
    mvhd = full_box(b"mvhd", 0, 0, struct.pack(">IIII", 0, 0, timescale, 0),
                    struct.pack(">iH", 0x10000, 0x0100), b"\x00" * 10, _MATRIX, b"\x00" * 24,
                    struct.pack(">I", TRACK_ID + 1))
    tkhd = full_box(b"tkhd", 0, 0x3, struct.pack(">IIIII", 0, 0, TRACK_ID, 0, 0), b"\x00" * 8,
                    struct.pack(">hhhH", 0, 0, 0, 0), _MATRIX, struct.pack(">II", width << 16, height << 16))
    mdhd = full_box(b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, timescale, 0, 0x55C4, 0))  # language "und"
    hdlr = full_box(b"hdlr", 0, 0, struct.pack(">I", 0), b"vide", b"\x00" * 12, b"VideoHandler\x00")
    dinf = box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1)))
    stbl = box(b"stbl",
               full_box(b"stsd", 0, 0, struct.pack(">I", 1), _avc1(width, height, avcc)),
               full_box(b"stts", 0, 0, struct.pack(">I", 0)),
               full_box(b"stsc", 0, 0, struct.pack(">I", 0)),
               full_box(b"stsz", 0, 0, struct.pack(">II", 0, 0)),
               full_box(b"stco", 0, 0, struct.pack(">I", 0)))
    minf = box(b"minf", full_box(b"vmhd", 0, 1, b"\x00" * 8), dinf, stbl)
    trak = box(b"trak", tkhd, box(b"mdia", mdhd, hdlr, minf))
    mvex = box(b"mvex", full_box(b"trex", 0, 0, struct.pack(">IIIII", TRACK_ID, 1, sample_duration, 0, 0)))
    return ftyp + box(b"moov", mvhd, trak, mvex)


@dataclass(frozen=True, slots=True)
class Sample:
    data: bytes  # one access unit, length-prefixed NAL units
    is_sync: bool  # IDR frame: decoding can start here


def fragment(sequence_number: int, base_decode_time: int, sample_duration: int, samples: list[Sample]) -> bytes:
    """moof + mdat carrying `samples` back to back, starting at `base_decode_time`."""
    assert samples and sequence_number >= 1

    def moof(data_offset: int) -> bytes:
        entries = b"".join(struct.pack(">III", sample_duration, len(s.data), _SYNC_FLAGS if s.is_sync
                                       else _NON_SYNC_FLAGS) for s in samples)
        traf = box(b"traf",
                   full_box(b"tfhd", 0, _TFHD_DEFAULT_BASE_IS_MOOF, struct.pack(">I", TRACK_ID)),
                   full_box(b"tfdt", 1, 0, struct.pack(">Q", base_decode_time)),
                   full_box(b"trun", 0, _TRUN_FLAGS, struct.pack(">Ii", len(samples), data_offset), entries))
        return box(b"moof", full_box(b"mfhd", 0, 0, struct.pack(">I", sequence_number)), traf)

    size = len(moof(0))  # the offset's value does not change the size
    return moof(size + 8) + box(b"mdat", *(s.data for s in samples))
