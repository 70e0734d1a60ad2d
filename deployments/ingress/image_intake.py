"""Session images decoded off the ingress's event loop, a few at a time.

A PNG or JPEG at the pixel limit (8192x4096 = 33.5 MP; a 108 KB file can declare it) takes
seconds of CPU and ~100 MB to decode. On the event loop that stalls every socket, `/healthz`
and Serve's own calls of the replica; here the declared size is checked from the header first
(`probe_image`, on the loop: cheap) and the pixels are decoded in a worker thread (Pillow
releases the GIL while it decodes). `DECODE_THREADS` per ingress replica bound the CPU and the
memory of decodes in progress; more wait their turn, each holding only its encoded bytes.
`FrameImage` holds the pixels of the frame a connection is handling, decoded so before its
dispatch takes them.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from protocol.image import decode_image, probe_image, raw_image
from protocol.limits import Limits

DECODE_THREADS = 2
_POOL = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="image-decode")


async def decode_off_loop(image: bytes | np.ndarray, limits: Limits) -> np.ndarray:
    """`decode_image` (RGB uint8 [H, W, 3]; ProtocolError as it raises) without blocking the
    event loop: the header is checked here, the pixels decoded in the pool."""
    if isinstance(image, np.ndarray):
        return raw_image(image, limits)  # already pixels: validation only
    probe_image(image, limits)  # an unreadable or oversized header is refused before any decode
    return await asyncio.get_running_loop().run_in_executor(_POOL, decode_image, image, limits)


class FrameImage:
    """The image of the frame a connection handles now: decoded off the loop before its
    dispatch (`decode`), whose `pixels` then take it; cleared after each frame."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._decoded: Optional[tuple[Any, np.ndarray]] = None  # (image sent, its pixels)

    async def decode(self, image: bytes | np.ndarray) -> None:
        """Decode `image` off the loop (ProtocolError as `decode_image` raises)."""
        self._decoded = (image, await decode_off_loop(image, self._limits))

    def clear(self) -> None:
        self._decoded = None

    def pixels(self, image: bytes | np.ndarray) -> np.ndarray:
        """The pixels of `image`: decoded off the loop by `decode`, else (a caller that did not) here."""
        if self._decoded is not None and self._decoded[0] is image:
            return self._decoded[1]
        return decode_image(image, self._limits)
