"""Fmp4Muxer: 1 + 6 chunks concatenate to one MP4 of 81 frames in order, every payload carries
all of its chunk's frames, every chunk starts with a keyframe; box structure; codec string."""
from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

from media import Fmp4Assembler, Fmp4Muxer

H, W = 64, 112
BITS = 7  # frame index as a 7-bit bar code: bar b (16 px wide) is white when bit b is set
CHUNKS = [9] + [12] * 6


def indexed_frame(idx: int, h: int = H, w: int = W) -> np.ndarray:
    frame = np.full((h, w, 3), 16, np.uint8)
    bar = w // BITS
    for b in range(BITS):
        if idx >> b & 1:
            frame[:, b * bar:(b + 1) * bar] = 235
    return frame


def read_indices(frames: np.ndarray) -> list[int]:
    bar = frames.shape[2] // BITS
    return [sum(int(f[:, b * bar:(b + 1) * bar].mean() > 128) << b for b in range(BITS)) for f in frames]


def boxes(data: bytes) -> list[tuple[bytes, bytes]]:
    """Top-level (type, payload) pairs of an ISO-BMFF byte string."""
    out, i = [], 0
    while i < len(data):
        size, kind = struct.unpack(">I4s", data[i:i + 8])
        assert size >= 8 and i + size <= len(data)
        out.append((kind, data[i + 8:i + size]))
        i += size
    return out


def child(payload: bytes, kind: bytes) -> bytes:
    return dict(boxes(payload))[kind]


@pytest.fixture(scope="module")
def session() -> tuple[Fmp4Muxer, list[bytes]]:
    muxer, payloads, n = Fmp4Muxer(W, H, fps=16), [], 0
    for t in CHUNKS:
        payloads.append(muxer.add_chunk(np.stack([indexed_frame(n + i) for i in range(t)])))
        n += t
    return muxer, payloads


def assembled(payloads: list[bytes]) -> Fmp4Assembler:
    asm = Fmp4Assembler()
    for p in payloads:
        asm.append(p)
    return asm


def test_concatenation_is_one_mp4_with_all_frames_in_order(session):
    muxer, payloads = session
    frames = assembled(payloads).decode_frames()
    assert frames.shape == (81, H, W, 3) and frames.dtype == np.uint8
    assert read_indices(frames) == list(range(81))
    assert (muxer.frames_done, muxer.chunks_done) == (81, 7)


def test_every_prefix_holds_every_frame_so_far(session):
    """No frame is held back: after chunk k the bytes sent decode to all 9 + 12k frames."""
    _, payloads = session
    for k in range(len(payloads)):
        frames = assembled(payloads[:k + 1]).decode_frames()
        assert read_indices(frames) == list(range(sum(CHUNKS[:k + 1])))


def test_late_joiner_can_start_at_any_chunk(session):
    """init segment + chunk k alone decodes (each chunk starts with an IDR frame)."""
    muxer, payloads = session
    for k in range(1, len(payloads)):
        asm = Fmp4Assembler()
        asm.append(muxer.init_segment)
        asm.append(payloads[k])
        start = sum(CHUNKS[:k])
        assert read_indices(asm.decode_frames()) == list(range(start, start + 12))


def test_box_structure(session):
    muxer, payloads = session
    first = boxes(payloads[0])
    assert [k for k, _ in first] == [b"ftyp", b"moov", b"moof", b"mdat"]
    assert payloads[0].startswith(muxer.init_segment)
    frames_before = 0
    for k, payload in enumerate(payloads):
        top = boxes(payload[len(muxer.init_segment) if k == 0 else 0:])
        assert [kind for kind, _ in top] == [b"moof", b"mdat"]
        (_, moof), (_, mdat) = top
        assert struct.unpack(">I", child(moof, b"mfhd")[4:8])[0] == k + 1  # sequence number continues
        traf = child(moof, b"traf")
        tfdt = child(traf, b"tfdt")
        assert tfdt[0] == 1 and struct.unpack(">Q", tfdt[4:12])[0] == frames_before * 1000  # 16 fps at 16 kHz
        trun = child(traf, b"trun")
        count, offset = struct.unpack(">Ii", trun[4:12])
        entries = np.frombuffer(trun[12:], ">u4").reshape(count, 3)  # duration, size, flags
        assert count == CHUNKS[k] and (entries[:, 0] == 1000).all()
        assert offset == len(moof) + 16  # moof header + mdat header: samples start the mdat payload
        assert entries[:, 1].sum() == len(mdat)
        assert entries[0, 2] == 0x02000000 and (entries[1:, 2] == 0x01010000).all()  # sync, then non-sync
        frames_before += count


def test_timescale_and_track_header(session):
    muxer, _ = session
    moov = dict(boxes(muxer.init_segment))[b"moov"]
    mdia = child(child(moov, b"trak"), b"mdia")
    assert struct.unpack(">I", child(mdia, b"mdhd")[12:16])[0] == 16000
    tkhd = child(child(moov, b"trak"), b"tkhd")
    assert struct.unpack(">II", tkhd[-8:]) == (W << 16, H << 16)
    trex = child(child(moov, b"mvex"), b"trex")
    assert struct.unpack(">IIIII", trex[4:]) == (1, 1, 1000, 0, 0)


@pytest.mark.parametrize("profile, preset, idc", [("baseline", "ultrafast", 0x42), ("main", "veryfast", 0x4D)])
def test_codec_string_is_read_from_the_avcc_record(profile, preset, idc):
    """`profile` caps the features; the SPS says what the stream uses (ultrafast: no CABAC)."""
    muxer = Fmp4Muxer(W, H, preset=preset, profile=profile)
    avcc = muxer.init_segment[muxer.init_segment.index(b"avcC") + 4:]
    assert avcc[0] == 1 and avcc[1] == idc
    assert muxer.codec_string == f"avc1.{avcc[1]:02X}{avcc[2]:02X}{avcc[3]:02X}"
    assert muxer.mime_type == f'video/mp4; codecs="{muxer.codec_string}"'
    frames = assembled([muxer.add_chunk(np.stack([indexed_frame(i) for i in range(5)]))]).decode_frames()
    assert read_indices(frames) == list(range(5))


def test_colours_survive():
    colours = np.array([[200, 30, 40], [20, 180, 60], [30, 40, 220], [128, 128, 128]], np.uint8)
    frames = np.repeat(np.repeat(colours[:, None, None, :], H, axis=1), W, axis=2)  # [4, H, W, 3] flat colours
    got = assembled([Fmp4Muxer(W, H).add_chunk(frames)]).decode_frames()
    assert np.abs(got.astype(int) - frames).mean(axis=(1, 2, 3)).max() < 4


def test_released_size_chunk_timing():
    """One 9-frame chunk at 464x832: encode time is reported and small."""
    h, w = 464, 832
    yy, xx = np.mgrid[0:h, 0:w]
    frames = np.stack([np.stack([(xx + 8 * t) % 256, (yy + 4 * t) % 256, (xx + yy) % 256], -1)
                       for t in range(9)]).astype(np.uint8)  # moving gradients
    frames[:, :64] = np.stack([indexed_frame(i, 64, w) for i in range(9)])
    muxer = Fmp4Muxer(w, h)
    payload = muxer.add_chunk(frames)
    assert 0 < muxer.last_encode_s < 2.0 and 0 <= muxer.last_mux_s < 0.5
    got = assembled([payload]).decode_frames()
    assert got.shape == (9, h, w, 3)
    assert read_indices(got[:, :64]) == list(range(9))
    print(f"464x832 x 9 frames: encode {muxer.last_encode_s:.3f}s, mux {muxer.last_mux_s:.4f}s, "
          f"{len(payload)} bytes, {muxer.codec_string}")


def test_ffprobe_reads_one_clean_stream(session, tmp_path):
    if shutil.which("ffprobe") is None:
        pytest.skip("ffprobe not installed (optional cross-check)")
    path = assembled(session[1]).write(tmp_path / "session.mp4")
    out = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-show_entries",
                          "stream=codec_name,profile,width,height,nb_read_frames,r_frame_rate,duration",
                          "-of", "json", str(path)], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    (stream,) = json.loads(out.stdout)["streams"]
    assert stream["codec_name"] == "h264" and stream["profile"] == "Constrained Baseline"
    assert (stream["width"], stream["height"], int(stream["nb_read_frames"])) == (W, H, 81)
    assert stream["r_frame_rate"] == "16/1" and float(stream["duration"]) == pytest.approx(81 / 16)


@pytest.mark.parametrize("size", [(111, 64), (112, 63), (8, 64)])
def test_frame_size_must_suit_yuv420(size):
    with pytest.raises(ValueError, match="even"):
        Fmp4Muxer(*size)


def test_bad_chunks_are_rejected():
    muxer = Fmp4Muxer(W, H)
    for frames in (np.zeros((2, H, W, 3), np.float32), np.zeros((2, W, H, 3), np.uint8), np.zeros((H, W, 3), np.uint8)):
        with pytest.raises(ValueError, match="uint8"):
            muxer.add_chunk(frames)
    with pytest.raises(ValueError, match="at least one frame"):
        muxer.add_chunk(np.zeros((0, H, W, 3), np.uint8))
    with pytest.raises(ValueError, match="profile"):
        Fmp4Muxer(W, H, profile="high")


MSE_PLAY = """async ([mime, parts]) => {
  const video = document.createElement('video');
  video.muted = true;
  const ms = new MediaSource();
  video.src = URL.createObjectURL(ms);
  await new Promise(r => ms.addEventListener('sourceopen', r, {once: true}));
  const sb = ms.addSourceBuffer(mime);
  const ends = [];
  for (const b64 of parts) {
    sb.appendBuffer(Uint8Array.from(atob(b64), c => c.charCodeAt(0)));
    await new Promise((res, rej) => { sb.addEventListener('updateend', res, {once: true});
                                      sb.addEventListener('error', () => rej('SourceBuffer error'), {once: true}); });
    ends.push(sb.buffered.end(sb.buffered.length - 1));
  }
  ms.endOfStream();
  await video.play();
  await new Promise(r => video.addEventListener('ended', r, {once: true}));
  return {supported: MediaSource.isTypeSupported(mime), ends, ranges: sb.buffered.length,
          frames: video.getVideoPlaybackQuality().totalVideoFrames, size: [video.videoHeight, video.videoWidth]};
}"""


def test_plays_in_a_browser_through_media_source_extensions(session):
    """Chromium (when installed) buffers every payload to the end of its chunk and plays all 81 frames."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium not installed (optional cross-check; apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    muxer, payloads = session
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"])
        try:
            page = browser.new_page()
            got = page.evaluate(MSE_PLAY, [muxer.mime_type, [base64.b64encode(x).decode() for x in payloads]])
        finally:
            browser.close()
    assert got["supported"] and got["ranges"] == 1 and got["size"] == [H, W]
    assert got["ends"] == pytest.approx(np.cumsum(CHUNKS) / 16)  # nothing held back at any chunk end
    assert got["frames"] == 81


def test_a_clone_goes_on_as_its_source_and_a_chunk_depends_on_its_frames_alone():
    """A fresh encoder per chunk: the muxer's state is its counters. A clone taken after chunk 1
    writes the same bytes as its source for the chunks after it, as does a muxer that saw other
    frames before (same counters); the forked stream decodes to its frames in order."""
    def chunk(n0: int, t: int = 12) -> np.ndarray:
        return np.stack([indexed_frame(n0 + i) for i in range(t)])

    source = Fmp4Muxer(W, H, fps=16)
    head = [source.add_chunk(chunk(0, 9)), source.add_chunk(chunk(9))]
    fork = source.clone()
    other = Fmp4Muxer(W, H, fps=16)
    other.add_chunk(chunk(50, 9))
    other.add_chunk(chunk(70))  # other frames before it, the same counters
    tail = []
    for n0 in (21, 33):
        a, b, c = source.add_chunk(chunk(n0)), fork.add_chunk(chunk(n0)), other.add_chunk(chunk(n0))
        assert a == b == c
        tail.append(b)
    assert (fork.chunks_done, fork.frames_done) == (source.chunks_done, source.frames_done) == (4, 45)
    assert read_indices(assembled(head + tail).decode_frames()) == list(range(45))
