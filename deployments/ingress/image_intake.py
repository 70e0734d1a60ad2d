"""Session images decoded off the ingress's event loop, a few at a time.

A PNG or JPEG at the pixel limit (8192x4096 = 33.5 MP; a 108 KB file can declare it) takes
seconds of CPU and ~100 MB to decode. On the event loop that stalls every socket, `/healthz`
and Serve's own calls of the replica; here the declared size is checked from the header first
(`probe_image`, on the loop: cheap) and the pixels are decoded in a worker thread (Pillow
releases the GIL while it decodes). `DECODE_THREADS` per ingress replica bound the CPU and the
memory of decodes in progress; more wait their turn, each holding only its encoded bytes.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

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
