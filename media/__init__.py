"""Video media: the per-session fragmented-MP4 muxer the VAE deployment writes chunks with
(`fmp4.py` over `h264.py` and `mp4_boxes.py`), and the client-side reassembly and decode of
the stream (`reassembly.py`). Encoding and decoding need PyAV (libx264), imported only by what
encodes or decodes (`pyav.py`): the client's core install has none; the wire contract
(`protocol`) never needs it.
"""
from media.reassembly import Fmp4Assembler


def __getattr__(name: str):  # `from media import Fmp4Muxer` imports PyAV only when asked for
    if name == "Fmp4Muxer":
        from media.fmp4 import Fmp4Muxer
        return Fmp4Muxer
    raise AttributeError(f"module 'media' has no attribute {name!r}")


__all__ = ["Fmp4Assembler", "Fmp4Muxer"]
