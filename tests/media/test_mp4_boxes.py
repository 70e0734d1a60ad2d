"""ISO-BMFF box writing: sizes, init segment layout, fragment offsets."""
from __future__ import annotations

import struct

from media.mp4_boxes import Sample, box, fragment, full_box, init_segment


def walk(data: bytes) -> list[tuple[bytes, bytes]]:
    out, i = [], 0
    while i < len(data):
        size, kind = struct.unpack(">I4s", data[i:i + 8])
        out.append((kind, data[i + 8:i + size]))
        i += size
    assert i == len(data)
    return out


def test_box_and_full_box_headers():
    assert box(b"free", b"ab", b"c") == struct.pack(">I", 11) + b"freeabc"
    got = full_box(b"mfhd", 1, 0x020003, b"\x00\x00\x00\x07")
    assert got == struct.pack(">I4sI", 16, b"mfhd", 0x01020003) + b"\x00\x00\x00\x07"


def test_init_segment_layout():
    data = init_segment(112, 64, 16000, 1000, b"\x01avcC-payload")
    (ftyp_kind, ftyp), (moov_kind, moov) = walk(data)
    assert (ftyp_kind, moov_kind) == (b"ftyp", b"moov") and ftyp[:4] == b"isom"
    assert [k for k, _ in walk(moov)] == [b"mvhd", b"trak", b"mvex"]
    trak = dict(walk(moov))[b"trak"]
    minf = dict(walk(dict(walk(dict(walk(trak))[b"mdia"]))[b"minf"]))
    stbl = dict(walk(minf[b"stbl"]))
    assert list(stbl) == [b"stsd", b"stts", b"stsc", b"stsz", b"stco"]
    assert all(struct.unpack(">I", stbl[k][4:8])[0] == 0 for k in (b"stts", b"stsc", b"stco"))  # no samples
    avc1 = stbl[b"stsd"][8:]
    (kind, entry), = walk(avc1)
    assert kind == b"avc1" and struct.unpack(">HH", entry[24:28]) == (112, 64)
    assert walk(entry[78:]) == [(b"avcC", b"\x01avcC-payload")]


def test_fragment_offsets_point_at_the_samples():
    samples = [Sample(b"A" * 5, True), Sample(b"B" * 7, False), Sample(b"C" * 3, False)]
    data = fragment(4, 9000, 1000, samples)
    (_, moof), (mdat_kind, mdat) = walk(data)
    assert mdat_kind == b"mdat" and mdat == b"A" * 5 + b"B" * 7 + b"C" * 3
    traf = dict(walk(moof))[b"traf"]
    parts = dict(walk(traf))
    assert struct.unpack(">I", parts[b"tfhd"][:4])[0] & 0x020000  # default-base-is-moof
    assert struct.unpack(">Q", parts[b"tfdt"][4:])[0] == 9000
    count, offset = struct.unpack(">Ii", parts[b"trun"][4:12])
    assert count == 3 and data[offset:offset + 5] == b"A" * 5  # offset from the start of moof
    assert struct.unpack(">9I", parts[b"trun"][12:]) == (1000, 5, 0x02000000, 1000, 7, 0x01010000,
                                                         1000, 3, 0x01010000)
    assert struct.unpack(">I", dict(walk(moof))[b"mfhd"][4:])[0] == 4
