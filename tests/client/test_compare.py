"""`lwf-client compare`: videos side by side, the longest's length, the shorter holding its last frame."""
from __future__ import annotations

import av
import numpy as np

from client.cli import main
from client.compare import GAP_PX, LABEL_MIN_PX, side_by_side
from media.fmp4 import Fmp4Muxer


def write_video(path, frames: np.ndarray) -> None:
    muxer = Fmp4Muxer(frames.shape[2], frames.shape[1])
    path.write_bytes(muxer.add_chunk(frames[:9]) + (muxer.add_chunk(frames[9:]) if len(frames) > 9 else b""))


def decode(path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def flat(n: int, h: int, w: int, value: int) -> np.ndarray:
    return np.full((n, h, w, 3), value, np.uint8)


def test_side_by_side_places_and_holds_frames():
    a, b = flat(3, 4, 6, 10), np.arange(2 * 2 * 4 * 3, dtype=np.uint8).reshape(2, 2, 4, 3)
    out = side_by_side([a, b], gap=2)
    assert out.shape == (3, 4, 6 + 2 + 4, 3)
    assert (out[:, :, :6] == 10).all() and (out[:, :, 6:8] == 0).all()
    np.testing.assert_array_equal(out[:2, :2, 8:], b)
    np.testing.assert_array_equal(out[2, :2, 8:], b[-1])  # held
    assert (out[:, 2:, 8:] == 0).all()  # below the shorter-in-height video: black


def test_compare_writes_the_side_by_side_mp4(tmp_path):
    a, b, out = tmp_path / "a.mp4", tmp_path / "b.mp4", tmp_path / "ab.mp4"
    write_video(a, flat(21, 32, 48, 40))
    write_video(b, flat(9, 32, 48, 200))
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 0
    frames = decode(out)
    band = LABEL_MIN_PX  # the label band above the videos
    assert frames.shape == (21, band + 32, 48 + GAP_PX + 48, 3)
    video = frames[:, band:]
    assert abs(video[:, :, :48].astype(int).mean() - 40) < 3
    assert abs(video[:, :, 48 + GAP_PX:].astype(int).mean() - 200) < 3  # frames 9..20 hold b's last
    assert video[:, :, 48 + 1:48 + GAP_PX - 1].max() < 30  # the gap stays dark


def test_each_half_is_labelled_with_its_name(tmp_path):
    """Text drawn into the band over each video: the file names by default, `--labels` when given."""
    a, b = tmp_path / "main.mp4", tmp_path / "branch.mp4"
    write_video(a, flat(9, 64, 96, 40))
    write_video(b, flat(9, 64, 96, 40))
    bands = {}
    for name, extra in (("default", []), ("labels", ["--labels", "left,right"]), ("same", ["--labels", "same,same"])):
        out = tmp_path / f"{name}.mp4"
        assert main(["compare", str(a), str(b), "-o", str(out), *extra]) == 0
        frames = decode(out)
        bands[name] = frames[0, :LABEL_MIN_PX].astype(int)
        assert frames.shape[1] == LABEL_MIN_PX + 64
        for half in (bands[name][:, :96], bands[name][:, 96 + GAP_PX:]):
            assert (half.max(axis=2) > 150).sum() > 10  # white text over each video
    left, right = bands["same"][:, :96], bands["same"][:, 96 + GAP_PX:]
    assert np.abs(left - right).mean() < 5  # the same label reads the same on both halves
    assert np.abs(bands["default"] - bands["labels"]).mean() > 5  # other names, other text
    assert np.abs(bands["labels"][:, :96] - bands["labels"][:, 96 + GAP_PX:]).mean() > 5  # left != right


def test_labels_must_name_every_video(tmp_path, capsys):
    a = tmp_path / "a.mp4"
    write_video(a, flat(9, 32, 48, 40))
    assert main(["compare", str(a), str(a), "--labels", "one", "-o", str(tmp_path / "x.mp4")]) == 2
    assert "--labels names 1 videos, 2 are given" in capsys.readouterr().err


def test_compare_refuses_bad_inputs(tmp_path, capsys):
    a = tmp_path / "a.mp4"
    write_video(a, flat(9, 32, 48, 40))
    assert main(["compare", str(a), "-o", str(tmp_path / "x.mp4")]) == 2
    assert "at least two videos" in capsys.readouterr().err
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    assert main(["compare", str(a), str(tmp_path / "junk.mp4"), "-o", str(tmp_path / "x.mp4")]) == 2
    assert "junk.mp4: not a readable video" in capsys.readouterr().err
    assert not (tmp_path / "x.mp4").exists()
