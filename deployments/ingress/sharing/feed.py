"""Feeds: one ingress replica's viewers of each world, fed by one long poll per world.

A `WorldFeed` polls the hub (hub.py `poll`) for the world's items after the last it read,
encodes each one once (a frame reply whose `session_id` is the world's id, or a `world`
notice) and puts the same bytes in the queue of every viewer on this replica. Nothing it does
waits for a viewer: each `ViewerQueue` has its own send task, and holds at most
`viewer_queue_chunks` chunks: a chunk that comes while it is full replaces the oldest one
queued (`skipped` counts them), so a viewer that reads too slowly skips whole chunks and goes
on at the next one (every chunk starts with an IDR); a viewer's catch-up (the last K chunks
first) is queued at once, so its queue holds at most max(`viewer_queue_chunks`, K). A feed
reads from the oldest chunk the hub keeps and keeps the last `hub_chunks` it read: a viewer
that joins it later starts from them (its catch-up), later items follow. Notices queue beside
the chunks (at most `MAX_NOTICES` of them, the oldest dropped); a viewer gets those after its
admission (its own `viewers` the first). A viewer's first chunk carries the init segment
in front (a copy made for it once): it decodes from its first frame reply on.

Memory per viewer: the queued references (the bytes are the feed's, shared by every viewer of
the replica), plus its first chunk's copy and the frame being sent; at most
max(`viewer_queue_chunks`, its catch-up) + 2 chunks' bytes while it is behind.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Optional

from ray.serve.handle import DeploymentHandle

from deployments.ingress.detached import retrieved, settle
from deployments.ingress.sharing.book import Joined, WorldChunk, WorldItem
from deployments.log import get_log
from media.reassembly import split_init
from protocol.codec import encode
from protocol.messages import FrameReply
from protocol.sharing import WorldNotice

POLL_S = 10.0  # one long poll's timeout at the hub
HUB_TIMEOUT_S = POLL_S + 10.0
MAX_HUB_FAILURES = 3  # polls in a row that fail before the viewers are told the world is lost
MAX_NOTICES = 16


def frame_of(world_id: str, chunk: WorldChunk, video: Optional[bytes] = None) -> bytes:
    return encode(FrameReply(session_id=world_id, chunk_id=chunk.chunk_id, video=video or chunk.video,
                             num_frames=chunk.num_frames, resolution=chunk.resolution, fps=chunk.fps,
                             mime_type=chunk.mime_type, event_id=chunk.event_id, player=chunk.player,
                             voters=None if chunk.voters is None else list(chunk.voters)))


class ViewerQueue:
    """One viewer's way out (module doc). `send(bytes)` writes a frame on its socket."""

    def __init__(self, world_id: str, send: Callable[[bytes], Awaitable[None]], max_chunks: int) -> None:
        self._world_id = world_id
        self._send = send
        self._max_chunks = max_chunks
        self._chunks: deque[tuple[bytes, WorldChunk]] = deque()
        self._notices: deque[bytes] = deque()
        self._order: deque[str] = deque()  # "c" / "n": the order in which they were put
        self._wake = asyncio.Event()
        self.init: Optional[bytes] = None
        self.viewer_id: Optional[str] = None  # its name in the world: a `kicked` notice naming it ends it
        self.kicked = False
        self.first = True  # no chunk sent yet: the next one carries the init segment
        self.skipped = 0
        self.sent = 0
        self.after_seq = self.notices_after = -1  # the world's items it gets: after these seqs (feed `add`)
        self.ended = asyncio.get_running_loop().create_future()  # set when the world ended (after its notice)
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(retrieved)

    def put_chunk(self, frame: bytes, chunk: WorldChunk) -> None:
        if len(self._chunks) >= self._max_chunks:
            self._chunks.popleft()
            self._order.remove("c")
            self.skipped += 1
        self._chunks.append((frame, chunk))
        self._order.append("c")
        self._wake.set()

    def put_notice(self, notice: bytes, last: bool = False) -> None:
        if len(self._notices) >= MAX_NOTICES:
            self._notices.popleft()
            self._order.remove("n")
        self._notices.append(notice)
        self._order.append("n" if not last else "e")
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._order:
                kind = self._order.popleft()
                if kind == "c":
                    frame, chunk = self._chunks.popleft()
                    if self.first and chunk.video[4:8] != b"ftyp" and self.init is not None:
                        frame = frame_of(self._world_id, chunk, self.init + chunk.video)
                    self.first = False
                    await self._send(frame)
                    self.sent += 1
                else:
                    await self._send(self._notices.popleft())
                    if kind == "e" and not self.ended.done():
                        self.ended.set_result(None)
                        return


class WorldFeed:
    """One world's items on this replica, to its viewers here (module doc)."""

    def __init__(self, hub: DeploymentHandle, world_id: str, joined: Joined, keep: int = 1) -> None:
        """`keep`: the chunks read last that a new viewer here may start from (its catch-up)."""
        self._hub = hub
        self._world_id = world_id
        self._seq = min(joined.kept_after, joined.after_seq)  # from the oldest chunk the hub keeps
        self._init = joined.init
        self._recent: deque[tuple[int, bytes, WorldChunk]] = deque(maxlen=max(1, keep))  # (seq, frame, chunk)
        self._viewers: set[ViewerQueue] = set()
        self._log = get_log("feed", world=world_id)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"feed-{world_id}")
        self.task.add_done_callback(retrieved)

    def add(self, viewer: ViewerQueue, joined: Joined) -> None:
        """A viewer from its first chunk (`joined.after_seq`): those the feed read already come
        from its recent chunks, the rest as the feed reads them."""
        viewer.init = self._init or joined.init
        viewer.after_seq, viewer.notices_after = joined.after_seq, joined.notices_after
        for seq, frame, chunk in self._recent:
            if seq > joined.after_seq:
                viewer.put_chunk(frame, chunk)
        self._viewers.add(viewer)

    def remove(self, viewer: ViewerQueue) -> bool:
        """Drop a viewer; True when none is left (the feed stops)."""
        self._viewers.discard(viewer)
        viewer.task.cancel()
        if not self._viewers:
            self.task.cancel()
        return not self._viewers

    async def _run(self) -> None:
        failures = 0
        while True:
            ended, result = await settle(self._hub.poll.remote(self._world_id, self._seq, POLL_S), HUB_TIMEOUT_S)
            if not ended or isinstance(result, BaseException):
                failures += 1
                self._log.warning("a poll of the world hub failed", fields={"error": repr(result)})
                if failures >= MAX_HUB_FAILURES:
                    self._end("the world hub was lost")
                    return
                await asyncio.sleep(1.0)
                continue
            failures = 0
            items, seq, gone = result
            for item in items:
                self._deliver(item)
                self._seq = max(self._seq, item.seq)
            self._seq = max(self._seq, seq)
            if gone:
                if not any(i.event == "ended" for i in items):
                    self._end("the world is gone (the server lost it)")
                return

    def _deliver(self, item: WorldItem) -> None:
        """An item to each viewer here whose start is before it (a chunk: its first chunk's seq;
        a notice: its admission's)."""
        if item.seq <= self._seq:
            return  # read already (a feed that started behind its hub's items)
        if item.chunk is not None:
            chunk = item.chunk
            if chunk.video[4:8] == b"ftyp":
                self._init = split_init(chunk.video)[0]
            frame = frame_of(self._world_id, chunk)
            self._recent.append((item.seq, frame, chunk))
            for viewer in self._viewers:
                if viewer.init is None:
                    viewer.init = self._init
                if item.seq > viewer.after_seq:
                    viewer.put_chunk(frame, chunk)
        else:
            notice = encode(WorldNotice(world_id=self._world_id, event=item.event, viewers=item.viewers,
                                        reason=item.reason, holder=item.holder, players=list(item.players),
                                        director=item.director, prompt=item.prompt))
            for viewer in self._viewers:
                if item.seq <= viewer.notices_after and item.event != "ended":
                    continue  # a notice from before it joined
                if item.event != "kicked":
                    viewer.put_notice(notice, last=item.event == "ended")
                elif viewer.viewer_id == item.target:  # to the viewer kicked only: its socket closes
                    viewer.kicked = True
                    viewer.put_notice(notice, last=True)

    def _end(self, reason: str) -> None:
        notice = encode(WorldNotice(world_id=self._world_id, event="ended", viewers=0, reason=reason))
        for viewer in self._viewers:
            viewer.put_notice(notice, last=True)


class Feeds:
    """The feeds of one ingress replica, one per watched world."""

    def __init__(self, hub: DeploymentHandle, keep: int = 1) -> None:
        """`keep`: the chunks a feed keeps for viewers that join it later (`sharing.hub_chunks`)."""
        self._hub = hub
        self._keep = keep
        self._feeds: dict[str, WorldFeed] = {}

    def __len__(self) -> int:
        return len(self._feeds)

    def attach(self, world_id: str, joined: Joined, viewer: ViewerQueue) -> None:
        feed = self._feeds.get(world_id)
        if feed is None or feed.task.done():
            feed = self._feeds[world_id] = WorldFeed(self._hub, world_id, joined, self._keep)
        feed.add(viewer, joined)

    def detach(self, world_id: str, viewer: ViewerQueue) -> None:
        feed = self._feeds.get(world_id)
        if feed is not None and feed.remove(viewer):
            del self._feeds[world_id]
