"""Video media: the per-session fragmented-MP4 muxer the VAE deployment writes chunks with
(`fmp4.py` over `h264.py` and `mp4_boxes.py`), and the client-side reassembly and decode of
the stream (`reassembly.py`). Needs PyAV (libx264); the wire contract (`protocol`) does not.
"""
from media.fmp4 import Fmp4Muxer
from media.reassembly import Fmp4Assembler

__all__ = ["Fmp4Assembler", "Fmp4Muxer"]
