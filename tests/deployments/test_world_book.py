"""WorldBook (deployments/ingress/sharing/book.py) and the feeds (feed.py) without Ray: tokens,
audience, limits, the hub's last chunks, owners away and gone; a viewer that never reads
while 20 others get every chunk."""
from __future__ import annotations

import asyncio

import pytest

from deployments.errors import Busy
from deployments.ingress.sharing.book import Joined, NotShared, WatchRefused, WorldBook
from deployments.ingress.sharing.feed import Feeds, ViewerQueue
from deployments.share_args import SharingArgs
from protocol import decode_reply
from protocol.messages import FrameReply
from protocol.sharing import WorldNotice
from world_book_fakes import INIT, FakeHub, chunk


def test_tokens_are_unguessable_bound_to_one_world_and_revoked_by_its_end():
    book = WorldBook(SharingArgs())
    a = book.share("key:a", "stream-1", "link", "owner", now=0.0)
    assert book.share("key:a", "stream-1", "link", "owner", now=1.0) is a  # shared again: the same world
    b = book.share("key:a", "stream-2", "link", "owner", now=0.0)
    assert len(a.token) >= 32 and a.token != b.token and a.world_id != b.world_id  # 24 random bytes: 192 bits
    with pytest.raises(WatchRefused):
        book.join(a.world_id, b.token, "key:v", "1.2.3.4", now=1.0)  # another world's token
    book.join(a.world_id, a.token, "key:v", "1.2.3.4", now=1.0)
    assert book.end("stream-1", "unshared", now=2.0, owner="key:other") is None  # only its owner unshares
    book.end("stream-1", "unshared", now=2.0, owner="key:a")
    with pytest.raises(WatchRefused):
        book.join(a.world_id, a.token, "key:v", "1.2.3.4", now=3.0)
    c = book.share("key:a", "stream-1", "link", "owner", now=4.0)  # shared again after: a new world, a new token
    assert (c.world_id, c.token) != (a.world_id, a.token)


def test_a_principal_share_admits_only_its_owner():
    book = WorldBook(SharingArgs())
    w = book.share("key:a", "s", "principal", "owner", now=0.0)
    with pytest.raises(WatchRefused):
        book.join(w.world_id, w.token, "key:b", "1.2.3.4", now=0.0)
    assert isinstance(book.join(w.world_id, w.token, "key:a", "1.2.3.4", now=0.0), Joined)


def test_viewer_limits_per_world_principal_and_address():
    book = WorldBook(SharingArgs(max_viewers=2, max_views_per_principal=3, joins_per_minute=4))
    w = [book.share("key:o", f"s{i}", "link", "owner", now=0.0) for i in range(4)]
    book.join(w[0].world_id, w[0].token, "key:1", "a1", now=0.0)
    book.join(w[0].world_id, w[0].token, "key:2", "a2", now=0.0)
    with pytest.raises(Busy, match="viewers"):
        book.join(w[0].world_id, w[0].token, "key:3", "a3", now=0.0)
    for i in (1, 2):
        book.join(w[i].world_id, w[i].token, "key:1", "a1", now=0.0)
    with pytest.raises(Busy, match="holds 3 viewer sockets"):
        book.join(w[3].world_id, w[3].token, "key:1", "a1", now=0.0)
    rated = WorldBook(SharingArgs(joins_per_minute=4))
    r = rated.share("key:o", "s", "link", "owner", now=0.0)
    for i in range(4):
        rated.join(r.world_id, r.token, f"key:{i}", "a9", now=float(i))
    with pytest.raises(Busy, match="within a minute") as e:
        rated.join(r.world_id, r.token, "key:x", "a9", now=3.0)
    assert e.value.retry_after_s == pytest.approx(57.0)
    rated.join(r.world_id, r.token, "key:x", "a9", now=61.0)  # the window moved on


def test_the_hub_keeps_the_last_chunks_and_a_late_joiner_starts_at_the_current_one():
    book = WorldBook(SharingArgs(hub_chunks=3))
    w = book.share("key:o", "s", "link", "owner", now=0.0)
    assert book.publish("s", chunk(0, init=True), now=0.0)
    assert not book.publish("s", chunk(0, init=True), now=0.0)  # a replay of a chunk sent already
    for k in range(1, 8):
        book.publish("s", chunk(k), now=0.0)
    items, seq, gone = book.after(w.world_id, 0)
    assert [i.chunk.chunk_id for i in items if i.chunk] == [5, 6, 7] and not gone
    joined = book.join(w.world_id, w.token, "key:v", "a", now=0.0)
    assert joined.init == INIT and joined.last_chunk_id == 7
    after, _, _ = book.after(w.world_id, joined.after_seq)
    assert after[0].chunk.chunk_id == 7 and after[1].event == "viewers"


def test_an_owner_away_past_its_grace_or_not_heard_ends_its_world():
    book = WorldBook(SharingArgs(owner_timeout_s=20.0))
    a = book.share("key:o", "a", "link", "owner", now=0.0)
    b = book.share("key:o", "b", "link", "owner", now=0.0)
    book.away("a", until=10.0)
    assert book.sweep(now=5.0) == []
    assert book.back("a", "key:o", now=6.0) is a  # resumed in time
    book.away("a", until=12.0)
    book.heard("b", now=15.0)
    assert book.sweep(now=13.0) == [a] and a.ended == "the owner did not come back"
    assert book.sweep(now=36.0) == [b] and b.ended == "the owner's server was lost"
    events = [i.event for i in book.after(a.world_id, 0)[0]]
    assert events == ["owner_reconnecting", "owner_back", "owner_reconnecting", "ended"]


def test_a_session_resumed_elsewhere_is_shared_only_with_its_init_segment():
    book = WorldBook(SharingArgs())
    with pytest.raises(NotShared):
        book.share("key:o", "s", "link", "owner", now=0.0, need_init=True)
    assert book.share("key:o", "s", "link", "owner", now=0.0, init=INIT, need_init=True).init == INIT


def test_a_viewer_that_never_reads_skips_while_twenty_others_get_every_chunk():
    """One feed, 21 viewers: one whose socket never takes a frame (its send waits forever).
    The others get every chunk in order; the stuck one holds at most `viewer_queue_chunks`."""
    async def go():
        book = WorldBook(SharingArgs(hub_chunks=64))
        w = book.share("key:o", "s", "link", "owner", now=0.0)
        hub = FakeHub(book)
        feeds = Feeds(hub)
        got: list[list[bytes]] = [[] for _ in range(20)]
        stuck = asyncio.Event()

        def sender(i):
            async def send(data: bytes) -> None:
                got[i].append(data)
            return send

        async def never(data: bytes) -> None:
            await stuck.wait()

        queues = []
        for i in range(21):
            joined = book.join(w.world_id, w.token, f"key:{i}", f"a{i}", now=0.0)
            queue = ViewerQueue(w.world_id, never if i == 20 else sender(i), max_chunks=2)
            feeds.attach(w.world_id, joined, queue)
            queues.append(queue)
        for k in range(30):
            book.publish("s", chunk(k, init=k == 0), now=0.0)
            hub.changed.set()
            await asyncio.sleep(0.005)  # a chunk interval (the owner's are > 0.1 s)
        for _ in range(200):
            await asyncio.sleep(0.005)
            if all(sum(isinstance(decode_reply(d), FrameReply) for d in g) == 30 for g in got):
                break
        book.end("s", "done", now=1.0)
        hub.changed.set()
        await asyncio.wait_for(asyncio.gather(*(q.ended for q in queues[:20])), 5)
        for q in queues:
            feeds.detach(w.world_id, q)
        return got, queues[20]

    got, slow = asyncio.run(go())
    for g in got:
        frames = [r for r in map(decode_reply, g) if isinstance(r, FrameReply)]
        assert [f.chunk_id for f in frames] == list(range(30))
        assert isinstance(decode_reply(g[-1]), WorldNotice) and decode_reply(g[-1]).event == "ended"
    assert slow.sent == 0 and slow.skipped == 28  # its send stuck on its first notice: 2 chunks queued, 28 skipped
