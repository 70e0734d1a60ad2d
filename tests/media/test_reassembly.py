"""Fmp4Assembler: ordering rule, file output, decode."""
from __future__ import annotations

import numpy as np
import pytest

from media import Fmp4Assembler, Fmp4Muxer


def test_first_payload_must_be_the_init_segment():
    muxer = Fmp4Muxer(32, 32)
    first = muxer.add_chunk(np.zeros((2, 32, 32, 3), np.uint8))
    later = muxer.add_chunk(np.zeros((3, 32, 32, 3), np.uint8))
    asm = Fmp4Assembler()
    with pytest.raises(ValueError, match="init segment"):
        asm.append(later)
    asm.append(first)
    asm.append(later)
    assert len(asm) == 2 and asm.data == first + later


def test_write_and_decode(tmp_path):
    muxer = Fmp4Muxer(32, 48)
    frames = np.zeros((4, 48, 32, 3), np.uint8)
    frames[:, :, :, 0] = np.array([0, 80, 160, 240], np.uint8)[:, None, None]  # red ramp over time
    asm = Fmp4Assembler()
    asm.append(muxer.add_chunk(frames))
    path = asm.write(tmp_path / "out.mp4")
    assert path.read_bytes() == asm.data
    got = asm.decode_frames()
    assert got.shape == (4, 48, 32, 3)
    np.testing.assert_allclose(got[:, :, :, 0].mean(axis=(1, 2)), [0, 80, 160, 240], atol=8)


def test_decode_needs_payloads():
    with pytest.raises(ValueError, match="no payloads"):
        Fmp4Assembler().decode_frames()
