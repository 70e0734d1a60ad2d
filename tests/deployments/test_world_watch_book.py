"""Watch extras without Ray (issue 56): a viewer's catch-up (book.py `join`, the feed's recent
chunks), the owner's notes (`prompt`, `paused`, `resumed`: book.py `note`), what a viewer
gets of the notices, and a fork's checks and meeting at the hub (book.py `may_fork`,
fork_asks.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from deployments.errors import Busy, SessionLost, TooLarge
from deployments.ingress.journal import SessionJournal
from deployments.ingress.sharing.book import WatchRefused, WorldBook
from deployments.ingress.sharing.fork_asks import ForkAsks
from deployments.ingress.sharing.fork_source import WorldHead, world_head
from deployments.ingress.stream import StreamState
from deployments.ingress.sharing.feed import Feeds, ViewerQueue
from deployments.share_args import SharingArgs
from deployments.wire import NoiseSnapshot
from protocol import decode_reply
from protocol.codec import validated
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import FrameReply
from protocol.sharing import WatchRequest, WorldNotice
from world_book_fakes import INIT, FakeHub, chunk


def test_catch_up_starts_a_viewer_at_the_oldest_of_its_last_k_chunks_at_most_hub_chunks():
    book = WorldBook(SharingArgs(hub_chunks=3))
    w = book.share("key:o", "s", "link", "owner", now=0.0)
    for k in range(6):
        book.publish("s", chunk(k, init=k == 0), now=0.0)
    starts = {k: book.join(w.world_id, w.token, f"key:{k}", f"a{k}", now=0.0, catch_up=k).last_chunk_id
              for k in (0, 1, 2, 3, 50)}
    assert starts == {0: 5, 1: 5, 2: 4, 3: 3, 50: 3}  # the hub keeps 3: a larger catch-up gets them all
    joined = book.join(w.world_id, w.token, "key:x", "ax", now=0.0, catch_up=2)
    items, _, _ = book.after(w.world_id, joined.after_seq)
    assert [i.chunk.chunk_id for i in items if i.chunk] == [4, 5]
    assert joined.kept_after < joined.after_seq < joined.notices_after  # a feed reads from the oldest kept
    assert [i.event for i in items if i.seq > joined.notices_after] == ["viewers"]  # its own, not the older ones


def test_notes_reach_viewers_in_order_and_the_world_keeps_its_state():
    book = WorldBook(SharingArgs())
    w = book.share("key:o", "s", "link", "owner", now=0.0, prompt="a quiet lake")
    assert book.note("s", "paused", now=1.0) and book.note("s", "paused", now=1.0)  # told once
    paused = book.join(w.world_id, w.token, "key:v", "a", now=1.0)
    assert paused.paused and paused.prompt == "a quiet lake"
    book.note("s", "resumed", now=2.0)
    book.note("s", "prompt", now=2.0, prompt="<b>a storm</b>")
    book.publish("s", chunk(0, init=True), now=2.0)
    items, _, _ = book.after(w.world_id, 0)
    assert [(i.event, i.prompt) for i in items if i.chunk is None] == [
        ("paused", None), ("viewers", None), ("resumed", None), ("prompt", "<b>a storm</b>")]
    again = book.join(w.world_id, w.token, "key:v2", "b", now=3.0)
    assert not again.paused and again.prompt == "<b>a storm</b>"
    hidden = book.share("key:o", "t", "link", "owner", now=0.0)  # no show_prompt: the owner's side sends none
    assert book.join(hidden.world_id, hidden.token, "key:v", "a", now=0.0).prompt is None
    assert not book.note("nobody", "paused", now=0.0)


def test_a_viewer_joining_a_running_feed_gets_its_catch_up_from_the_feeds_recent_chunks():
    """Two viewers on one feed: the first (no catch-up) started it; the second asks for 3 after
    the feed read chunks 0..4: it gets 2, 3, 4 (the first with the init segment in front), then
    chunk 5 live, and only the notices from its admission on."""
    async def go():
        book = WorldBook(SharingArgs(hub_chunks=4))
        w = book.share("key:o", "s", "link", "owner", now=0.0)
        hub = FakeHub(book)
        feeds = Feeds(hub, keep=4)
        got: dict[str, list[bytes]] = {"a": [], "b": []}

        def sender(name):
            async def send(data: bytes) -> None:
                got[name].append(data)
            return send

        a = ViewerQueue(w.world_id, sender("a"), max_chunks=2)
        feeds.attach(w.world_id, book.join(w.world_id, w.token, "key:a", "1", now=0.0), a)
        for k in range(5):
            book.publish("s", chunk(k, init=k == 0), now=0.0)
            hub.changed.set()
            await asyncio.sleep(0.01)
        book.note("s", "paused", now=0.0)
        hub.changed.set()
        await asyncio.sleep(0.01)
        b = ViewerQueue(w.world_id, sender("b"), max_chunks=3)
        feeds.attach(w.world_id, book.join(w.world_id, w.token, "key:b", "2", now=0.0, catch_up=3), b)
        hub.changed.set()
        await asyncio.sleep(0.01)
        book.publish("s", chunk(5), now=0.0)
        book.end("s", "done", now=1.0)
        hub.changed.set()
        await asyncio.wait_for(asyncio.gather(a.ended, b.ended), 5)
        for q in (a, b):
            feeds.detach(w.world_id, q)
        return [decode_reply(d) for d in got["a"]], [decode_reply(d) for d in got["b"]]

    a, b = asyncio.run(go())
    assert [r.chunk_id for r in a if isinstance(r, FrameReply)] == [0, 1, 2, 3, 4, 5]
    frames = [r for r in b if isinstance(r, FrameReply)]
    assert [f.chunk_id for f in frames] == [2, 3, 4, 5] and frames[0].video[:len(INIT)] == INIT
    assert frames[1].video == chunk(3).video  # only the first carries the init segment
    events = [r.event for r in b if isinstance(r, WorldNotice)]
    assert events == ["viewers", "ended"]  # not the `paused` (and viewer counts) from before it joined
    assert "paused" in [r.event for r in a if isinstance(r, WorldNotice)]


def test_a_fork_is_allowed_by_the_token_and_audience_of_a_live_world():
    book = WorldBook(SharingArgs(max_viewers=1))
    link = book.share("key:o", "s", "link", "owner", now=0.0)
    book.join(link.world_id, link.token, "key:v", "a", now=0.0)  # the world is full of viewers: a fork is no viewer
    assert book.may_fork(link.world_id, link.token, "key:other") is link
    mine = book.share("key:o", "t", "principal", "owner", now=0.0)
    assert book.may_fork(mine.world_id, mine.token, "key:o") is mine
    with pytest.raises(WatchRefused):
        book.may_fork(mine.world_id, mine.token, "key:other")
    with pytest.raises(WatchRefused):
        book.may_fork(link.world_id, mine.token, "key:o")
    book.end("s", "unshared", now=1.0)
    with pytest.raises(WatchRefused):
        book.may_fork(link.world_id, link.token, "key:other")


def test_fork_asks_meet_their_owners_answer_or_time_out():
    """An ask waits for the owner side's answer to it (`wanted` takes every waiting ask once);
    unanswered, it is `busy`; an answer to a gone ask is dropped; `forget` ends the owner's poll."""
    async def go():
        asks = ForkAsks()
        first = asyncio.ensure_future(asks.ask("s", timeout_s=5.0))
        second = asyncio.ensure_future(asks.ask("s", timeout_s=5.0))
        await asyncio.sleep(0)
        taken = await asks.wanted("s", timeout_s=5.0)
        assert len(taken) == 2 and await asks.wanted("s", timeout_s=0.01) == []  # taken once
        assert asks.answer(taken[0], "head-1") and asks.answer(taken[1], "head-2")
        answers = (await first, await second)
        with pytest.raises(Busy, match="did not answer"):
            await asks.ask("s", timeout_s=0.01)
        late = await asks.wanted("s", timeout_s=0.01)
        poll = asyncio.ensure_future(asks.wanted("t", timeout_s=5.0))
        await asyncio.sleep(0)
        asks.forget("t")
        return answers, late, asks.answer("gone", "x"), await asyncio.wait_for(poll, 1.0)

    answers, late, gone, forgotten = asyncio.run(go())
    assert answers == ("head-1", "head-2") and late == [] and not gone and forgotten == []


def test_a_watch_asks_for_at_most_64_chunks_of_catch_up():
    ok = validated(WatchRequest, {"endpoint": "watch", "world_id": "w", "watch_token": "t", "catch_up": 64})
    assert ok.catch_up == 64 and validated(WatchRequest, {"world_id": "w", "watch_token": "t"}).catch_up == 0
    for bad in (65, -1, "3", 2.0):
        with pytest.raises(ProtocolError) as e:
            validated(WatchRequest, {"endpoint": "watch", "world_id": "w", "watch_token": "t", "catch_up": bad})
        assert e.value.code is ErrorCode.BAD_MESSAGE


def _journal(chunks: int, max_bytes: int | None = 1 << 20) -> SessionJournal:
    j = SessionJournal(np.zeros((4, 4, 3), np.uint8), max_bytes)
    j.set_context(np.zeros((2, 4), np.float32))
    for k in range(chunks):
        j.add_chunk(np.zeros((1, 4, 4)), np.zeros((1, 4)), np.zeros(2), np.full(3, k, np.float32),
                    NoiseSnapshot(rng=np.full(4, k, np.uint8), whole_drawn=False))
    j.steer(1, "a storm")
    j.inherit_snapshot(1, ("dit-snap", "vae-snap"))
    return j


def test_a_worlds_head_is_its_sent_chunks_journal_without_the_owners_snapshots():
    """world_head (fork_source.py): the journal's first `chunks` chunks (a copy: the owner's goes
    on), the prompt updates before them, no replica snapshot ids of the owner's; a typed error
    when there is no chunk yet, the session ended, or its journal is over budget."""
    def stream(journal, state=StreamState.OPEN):
        return SimpleNamespace(journal=journal, state=state, spec="spec", image="image")

    own = _journal(3)
    head = world_head(stream(own), 2)
    assert isinstance(head, WorldHead) and head.chunks == 2 and len(head.journal.chunks) == 2
    assert head.journal.prompt_after(2, "opened") == "a storm" and head.journal.snapshots == {}
    assert len(own.chunks) == 3 and own.snapshots  # the owner's journal unchanged
    assert isinstance(world_head(stream(own), 0), SessionLost)
    assert isinstance(world_head(stream(own, StreamState.CLOSED), 2), SessionLost)
    assert isinstance(world_head(stream(_journal(3, max_bytes=None)), 2), TooLarge)
    assert isinstance(world_head(stream(own), 4), TooLarge)  # (more than it journaled: never a partial head)
