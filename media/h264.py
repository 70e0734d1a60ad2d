"""H.264 bitstream helpers for MP4 (ISO/IEC 14496-15): Annex-B -> length-prefixed NAL units,
the avcC decoder configuration record, and the RFC 6381 codec string."""
from __future__ import annotations

_START = b"\x00\x00\x01"
NAL_SPS, NAL_PPS = 7, 8
LENGTH_SIZE = 4  # bytes of the NAL length prefix in samples (avcC lengthSizeMinusOne = 3)


def split_annexb(data: bytes) -> list[bytes]:
    """NAL units of an Annex-B byte stream (start codes 00 00 01 or 00 00 00 01)."""
    i = data.find(_START)
    assert i >= 0, "encoder output is not an Annex-B stream"
    nals = []
    while i >= 0:
        nxt = data.find(_START, i + 3)
        # A NAL unit never ends in a zero byte (rbsp stop bit), so trailing zeros are the
        # leading zero of a 4-byte start code or trailing_zero_8bits.
        nal = data[i + 3: len(data) if nxt < 0 else nxt].rstrip(b"\x00")
        if nal:
            nals.append(nal)
        i = nxt
    return nals


def annexb_to_avcc(data: bytes) -> bytes:
    """One access unit: Annex-B start codes -> 4-byte big-endian length prefixes (MP4 sample)."""
    return b"".join(len(nal).to_bytes(LENGTH_SIZE, "big") + nal for nal in split_annexb(data))


def parameter_sets(extradata: bytes) -> tuple[list[bytes], list[bytes]]:
    """(SPS list, PPS list) from Annex-B extradata (what libx264 writes with a global header)."""
    nals = split_annexb(extradata)
    sps = [n for n in nals if n[0] & 0x1F == NAL_SPS]
    pps = [n for n in nals if n[0] & 0x1F == NAL_PPS]
    assert sps and pps, "encoder extradata lacks SPS/PPS"
    return sps, pps


def avcc_record(sps: list[bytes], pps: list[bytes]) -> bytes:
    """AVCDecoderConfigurationRecord (the payload of the avcC box) for baseline/main profiles."""
    profile = sps[0][1]
    assert profile in (66, 77), "high-profile avcC needs the chroma/bit-depth extension fields"
    out = bytearray([1, profile, sps[0][2], sps[0][3], 0xFC | (LENGTH_SIZE - 1), 0xE0 | len(sps)])
    for nal in sps:
        out += len(nal).to_bytes(2, "big") + nal
    out.append(len(pps))
    for nal in pps:
        out += len(nal).to_bytes(2, "big") + nal
    return bytes(out)


def codec_string(sps: bytes) -> str:
    """RFC 6381 `avc1.PPCCLL` (profile, constraint flags, level) for MSE / <video> type checks."""
    return f"avc1.{sps[1]:02X}{sps[2]:02X}{sps[3]:02X}"
