"""Per-session fragmented-MP4 muxer: chunk 0 -> ftyp+moov+moof+mdat, later chunks -> moof+mdat.

Concatenating the payloads of a session gives one valid MP4 with every frame, and each payload
carries all frames of its chunk when it is returned. PyAV's mp4 muxer cannot do that: it
writes a fragment only when the next packet arrives (each chunk would be one frame short until
the next one), and muxing chunks separately restarts sequence numbers and decode times. So the
frames are encoded with a bare libx264 CodecContext and the boxes are written here.

Encoder settings and why:
- `tune=zerolatency`: no lookahead, no frame threads (slice threads instead), no B-frames, so
  every frame's packet comes out of `encode()` immediately; nothing is held back at a chunk end.
- No B-frames also means decode order = presentation order: no composition offsets (ctts).
- The first frame of every chunk is forced to an IDR (`pict_type=I` + `forced-idr`) and no other
  keyframes are inserted (`keyint=infinite`, `scenecut=0`): a late joiner, a reconnecting client
  or an MSE SourceBuffer can start at any chunk with the init segment.
- Global header: SPS/PPS go into the avcC box of the init segment once (sample entry `avc1`).
- `profile=baseline` caps the stream at constrained baseline (the ultrafast preset uses no
  CABAC/8x8/B-frames anyway): decodable by every browser's MSE. `main` with a slower preset
  gives CABAC. `codec_string` reports what the SPS actually says (e.g. `avc1.42C01E`).
- The colour matrix of the RGB -> YUV conversion (BT.601, swscale's default) is signalled in the
  VUI so that players convert back with the same matrix.
- **A fresh encoder per chunk** (opening one costs ~6.5 ms at 464x832): every chunk starts with
  an IDR anyway, so a chunk's bytes then depend on its frames alone, not on the encoder's
  history (rate control, IDR ids): the muxer's state is its counters and `clone` copies it
  (a fork continues the stream exactly as its source would; deployments/replicas/vae.py).
"""
from __future__ import annotations

import time
from fractions import Fraction

import av
import numpy as np
from av.video.frame import PictureType

from media import h264, mp4_boxes

TICKS_PER_FRAME = 1000  # timescale = 1000·fps: exact frame durations (16 fps -> 16000 Hz)
_X264_PARAMS = "keyint=infinite:scenecut=0:colorprim=bt709:transfer=bt709:colormatrix=smpte170m"


class Fmp4Muxer:
    """H.264 encoder + fMP4 fragmenter for one session's chunks of RGB frames."""

    def __init__(self, width: int, height: int, fps: int = 16, *, preset: str = "ultrafast",
                 profile: str = "baseline", crf: int = 23) -> None:
        if width < 16 or height < 16 or width % 2 or height % 2:
            raise ValueError(f"frame size must be even and at least 16x16 for yuv420p, got {width}x{height}")
        if profile not in ("baseline", "main"):
            raise ValueError(f"profile must be 'baseline' or 'main' (browser-safe), got {profile!r}")
        self.width, self.height, self.fps = width, height, fps
        self._options = {"preset": preset, "tune": "zerolatency", "profile": profile, "crf": str(crf),
                         "forced-idr": "1", "x264-params": _X264_PARAMS}
        self._extradata = bytes(self._encoder().extradata)
        sps, pps = h264.parameter_sets(self._extradata)
        self.codec_string = h264.codec_string(sps[0])
        self.mime_type = f'video/mp4; codecs="{self.codec_string}"'
        self.init_segment = mp4_boxes.init_segment(width, height, TICKS_PER_FRAME * fps, TICKS_PER_FRAME,
                                                   h264.avcc_record(sps, pps))
        self.frames_done = 0
        self.chunks_done = 0
        self.last_encode_s = 0.0
        self.last_mux_s = 0.0

    def _encoder(self) -> av.CodecContext:
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt = self.width, self.height, "yuv420p"
        ctx.time_base = Fraction(1, self.fps)
        ctx.framerate = Fraction(self.fps)
        ctx.flags |= av.codec.context.Flags.global_header
        ctx.options = dict(self._options)
        ctx.open()
        return ctx

    def clone(self) -> "Fmp4Muxer":
        """An independent muxer at this one's position: its next chunks are the bytes this one's
        would be (nothing but counters carries over from chunk to chunk)."""
        copy = object.__new__(Fmp4Muxer)
        copy.__dict__.update(self.__dict__)
        copy._options = dict(self._options)
        return copy

    def skip_chunk(self, num_frames: int) -> None:
        """Count a chunk of `num_frames` frames whose bytes were written before (a session
        rebuilt from its journal): the next chunk's fragment follows it."""
        if num_frames <= 0:
            raise ValueError("a chunk needs at least one frame")
        self.frames_done += num_frames
        self.chunks_done += 1

    def add_chunk(self, frames: np.ndarray) -> bytes:
        """Encode uint8 [T, H, W, 3] RGB frames; returns init segment + fragment for the first
        chunk, the fragment (moof + mdat) for later ones."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise ValueError(f"frames must be uint8 [T, {self.height}, {self.width}, 3], "
                             f"got {frames.dtype} {list(frames.shape)}")
        if len(frames) == 0:
            raise ValueError("a chunk needs at least one frame")
        t0 = time.perf_counter()
        encoder = self._encoder()
        assert bytes(encoder.extradata) == self._extradata, "the encoder's SPS / PPS changed"
        packets = []
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24").reformat(format="yuv420p")
            frame.pts = i  # the chunk's own clock: the fragment's decode times come from frames_done
            frame.pict_type = PictureType.I if i == 0 else PictureType.NONE
            packets += encoder.encode(frame)
        assert len(packets) == len(frames), "encoder held frames back (zerolatency must be on)"
        assert packets[0].is_keyframe, "each chunk must start with an IDR frame"
        t1 = time.perf_counter()
        samples = [mp4_boxes.Sample(h264.annexb_to_avcc(bytes(p)), p.is_keyframe) for p in packets]
        payload = mp4_boxes.fragment(self.chunks_done + 1, self.frames_done * TICKS_PER_FRAME,
                                     TICKS_PER_FRAME, samples)
        if self.chunks_done == 0:
            payload = self.init_segment + payload
        self.frames_done += len(frames)
        self.chunks_done += 1
        self.last_encode_s, self.last_mux_s = t1 - t0, time.perf_counter() - t1
        return payload
