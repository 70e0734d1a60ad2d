"""camera/frames.py: output size, the frame plan and the chunk geometry constants."""
from __future__ import annotations

import pytest

from camera import (CHUNK_LATENT_FRAMES, MAX_CHUNKS, MAX_LATENT_FRAMES, MAX_NUM_FRAMES, chunk_video_frames,
                    frame_plan, num_chunks, output_size, parse_size, planned_latent_frames)


def test_output_size():
    area = parse_size("480*832")
    assert area == 399360
    assert output_size(area, 720, 1280) == (464, 832)  # 16:9
    assert output_size(area, 3648, 5472) == (512, 768)  # 3:2 (example 04)
    assert output_size(area, 2894, 5145) == (464, 832)  # example 03
    assert output_size(7300, 720, 1280) == (64, 112)  # the tiny goldens
    with pytest.raises(ValueError):
        parse_size("480x")
    with pytest.raises(ValueError):
        output_size(10, 720, 1280)


def test_frame_plan():
    assert frame_plan(81, 961) == (81, 21, 81)
    assert frame_plan(21, 961) == (21, 6, 21)
    assert frame_plan(29, 561) == (29, 6, 21)  # lat_f 8 -> 6: poses spread over 29 frames
    assert frame_plan(45, 269) == (45, 12, 45)
    assert frame_plan(83, 961) == (81, 21, 81)  # rounded down to 4n+1
    assert frame_plan(81, 30) == (29, 6, 21)  # capped by the trajectory
    assert num_chunks(81) == 7 and num_chunks(29) == 2 and num_chunks(9) == 1
    with pytest.raises(ValueError):
        frame_plan(5, 100)  # not a full chunk


def test_too_few_frames_are_said_in_frames_not_latent_frames():
    """`--frames 5` (issue 48): the answer names the frame counts a user may ask for."""
    with pytest.raises(ValueError) as e:
        frame_plan(5, 100)
    assert str(e.value) == ("5 frames make no whole chunk: a video has 9 + 12k frames (9, 21, 33, ...); "
                            "ask for at least 9")
    assert "latent" not in str(e.value)
    with pytest.raises(ValueError, match=r"^5 poses \(for 81 frames\) make no whole chunk"):
        frame_plan(81, 5)  # the trajectory is the short side


def test_chunk_video_frames_add_up_to_the_frame_plan():
    """9 + 12 + 12 + ... frames decode from a plan's chunks: the plan's F (spec B.1)."""
    for requested in (9, 21, 33, 81, 961):
        _, lat_f, video_frames = frame_plan(requested, requested)
        chunks = lat_f // CHUNK_LATENT_FRAMES
        assert sum(chunk_video_frames(k) for k in range(chunks)) == video_frames
    assert planned_latent_frames(None) is None and planned_latent_frames(81) == 21


def test_the_largest_session_fits_the_rope_table():
    """MAX_NUM_FRAMES declares exactly MAX_CHUNKS chunks, whose latent frames stay within the
    table; one more chunk would not."""
    assert num_chunks(MAX_NUM_FRAMES) == MAX_CHUNKS
    assert MAX_CHUNKS * CHUNK_LATENT_FRAMES <= MAX_LATENT_FRAMES < (MAX_CHUNKS + 1) * CHUNK_LATENT_FRAMES
    assert num_chunks(MAX_NUM_FRAMES + 4 * CHUNK_LATENT_FRAMES) == MAX_CHUNKS + 1
