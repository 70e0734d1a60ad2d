"""The world hub's book without Ray, for tests/deployments/test_world_book.py and
test_world_watch_book.py: a stand-in fMP4 chunk and a hub whose `poll` the book answers."""
from __future__ import annotations

import asyncio

from deployments.ingress.sharing.book import WorldBook, WorldChunk

INIT = b"\x00\x00\x00\x10ftypisom" + b"\x00" * 4 + b"\x00\x00\x00\x08moov"


def chunk(k: int, init: bool = False) -> WorldChunk:
    video = (INIT if init else b"") + b"\x00\x00\x00\x0cmoof" + k.to_bytes(4, "big")
    return WorldChunk(chunk_id=k, video=video, num_frames=12, resolution=(32, 48), fps=16, mime_type="video/mp4",
                      digest=f"d{k}")


class FakeHub:
    """`poll.remote(world_id, after, timeout)` answered from a WorldBook, as hub.py does."""

    def __init__(self, book: WorldBook) -> None:
        self.book = book
        self.changed = asyncio.Event()
        self.poll = self

    def remote(self, world_id: str, after: int, timeout_s: float):
        async def poll():
            while not (result := self.book.after(world_id, after))[0] and not result[2]:
                self.changed.clear()
                await self.changed.wait()
            return result
        return poll()
