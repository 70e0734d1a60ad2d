"""PyAV, imported only where video is decoded or encoded.

The client distribution's core install has no PyAV (its FFmpeg build is about 100 MB, two
thirds of the install; docs/ARCHITECTURE.md, "The client package"): `orbit`, `drive` and a fork
write the fMP4 bytes as received and never decode. Decoded frames (`Chunk.frames`) and
`lwf-client compare` need it and say so in one line, naming the `video` extra. The server's
environment always has PyAV.
"""
from __future__ import annotations

from types import ModuleType

EXTRA = "video"
INSTALL = f"pip install 'lingbot-world-client[{EXTRA}]'"


class MissingPyAV(ImportError):
    """PyAV is not installed; the message says what needs it and the install line."""


def require_av(what: str) -> ModuleType:
    """The `av` module, or MissingPyAV naming `what` needs it and the extra that brings it."""
    try:
        import av
    except ImportError:
        raise MissingPyAV(f"{what} needs PyAV, which this install lacks: {INSTALL} "
                          f"(from a checkout: pip install './clients/python[{EXTRA}]')") from None
    return av
