"""media/retime.py: a watched world's chunks (a late join, a skipped chunk, the owner's Undo)
become one MP4 whose frames play back to back from 0, the pixels unchanged."""
from __future__ import annotations

import io

import av
import numpy as np
import pytest

from media.fmp4 import TICKS_PER_FRAME, Fmp4Muxer
from media.fragment_check import fragment_problem
from media.reassembly import decode_fragment, split_init
from media.retime import Retimer

W, H = 64, 48


def chunks() -> tuple[bytes, list[bytes]]:
    """The init segment and 4 fragments of 9, 12, 12, 12 frames (frame i is a flat grey i * 5)."""
    muxer, fragments, n = Fmp4Muxer(W, H), [], 0
    for t in (9, 12, 12, 12):
        frames = np.stack([np.full((H, W, 3), 5 * (n + i), np.uint8) for i in range(t)])
        fragments.append(muxer.add_chunk(frames))
        n += t
    init, first = split_init(fragments[0])
    return init, [first, *fragments[1:]]


def decoded(data: bytes) -> tuple[list[int], np.ndarray]:
    with av.open(io.BytesIO(data), format="mp4") as container:
        frames = list(container.decode(video=0))
    return [f.pts for f in frames], np.stack([f.to_ndarray(format="rgb24") for f in frames])


def test_a_late_join_a_skip_and_an_undo_play_back_to_back_from_zero():
    init, (c0, c1, c2, c3) = chunks()
    watched = [init + c1, c3, c2, c3]  # joined at chunk 1, chunk 2 skipped, the owner undid chunk 3
    retime = Retimer()
    out = [retime(p) for p in watched]
    assert [len(p) for p in out] == [len(p) for p in watched]  # same sizes: only the times changed
    assert fragment_problem(out[0], first=True) is None and all(fragment_problem(p, first=False) is None for p in out[1:])
    pts, frames = decoded(b"".join(out))
    assert pts == [i * TICKS_PER_FRAME for i in range(48)]  # from 0, no gap, never back
    expected = np.concatenate([decode_fragment(init, c) for c in (c1, c3, c2, c3)])
    np.testing.assert_array_equal(frames, expected)
    assert retime.decode_time == 48 * TICKS_PER_FRAME and retime.sequence == 4


def test_as_they_came_the_timeline_starts_late_and_goes_back():
    """What the retiming is for: the same payloads concatenated as they came."""
    init, (c0, c1, c2, c3) = chunks()
    pts, _ = decoded(b"".join([init + c1, c3, c2, c3]))
    assert pts[0] == 9 * TICKS_PER_FRAME and min(np.diff(pts)) < 0


def test_not_fmp4_is_a_value_error():
    with pytest.raises(ValueError):
        Retimer()(b"\x00\x00\x00\x10moof" + b"\x00" * 4)
