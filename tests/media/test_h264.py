"""H.264 helpers: Annex-B splitting, AVCC length prefixes, avcC record, codec string."""
from __future__ import annotations

import pytest

from media.h264 import annexb_to_avcc, avcc_record, codec_string, parameter_sets, split_annexb

SPS = bytes([0x67, 0x42, 0xC0, 0x1E, 0xDA, 0x03, 0x40])
PPS = bytes([0x68, 0xCE, 0x0F, 0xC8])
IDR = bytes([0x65, 0x88, 0x84, 0x00, 0x00, 0x03, 0x01, 0x7F])  # contains an emulation-prevention 00 00 03


def test_split_handles_3_and_4_byte_start_codes_and_trailing_zeros():
    stream = b"\x00\x00\x00\x01" + SPS + b"\x00\x00\x01" + PPS + b"\x00\x00" + b"\x00\x00\x00\x01" + IDR
    assert split_annexb(stream) == [SPS, PPS, IDR]


def test_split_requires_a_start_code():
    with pytest.raises(AssertionError):
        split_annexb(IDR)


def test_annexb_to_avcc_length_prefixes():
    out = annexb_to_avcc(b"\x00\x00\x00\x01" + SPS + b"\x00\x00\x01" + IDR)
    assert out == len(SPS).to_bytes(4, "big") + SPS + len(IDR).to_bytes(4, "big") + IDR


def test_parameter_sets_and_avcc_record():
    sps, pps = parameter_sets(b"\x00\x00\x00\x01" + SPS + b"\x00\x00\x00\x01" + PPS)
    assert (sps, pps) == ([SPS], [PPS])
    rec = avcc_record(sps, pps)
    assert rec == (bytes([1, 0x42, 0xC0, 0x1E, 0xFF, 0xE1]) + len(SPS).to_bytes(2, "big") + SPS
                   + bytes([1]) + len(PPS).to_bytes(2, "big") + PPS)


def test_codec_string_is_profile_constraints_level_in_hex():
    assert codec_string(SPS) == "avc1.42C01E"
    assert codec_string(bytes([0x67, 0x4D, 0x40, 0x1F])) == "avc1.4D401F"
