"""ParkingBook (deployments/ingress/parking.py) without Ray: tokens, principals, the grace period, bounds."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.ingress import parking
from deployments.errors import SessionLost, Unauthorized
from deployments.ingress.journal import SessionJournal
from deployments.ingress.parking import ParkedSession, ParkingBook, UnknownClip, UnknownToken, new_token, token_digest
from deployments.wire import SessionOptions
from protocol.messages import FrameReply


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def record(token: str, sid: str = "s", principal=None, clip=False, video_bytes: int = 10, owner=None) -> ParkedSession:
    spec = SessionOptions(session_id=sid, prompt="p", image_digest="d", resolution=(32, 48), seed=1,
                          total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))
    reply = FrameReply(session_id=sid, chunk_id=0, video=b"v" * video_bytes, num_frames=9, resolution=(32, 48))
    return ParkedSession(spec=spec, journal=SessionJournal(np.zeros((4, 4, 3), np.uint8), 1 << 20),
                         image=None, key=f"{sid}~k", dit_key=f"{sid}~d", vae_key=f"{sid}~v", next_chunk=1, sent=1,
                         prompt="p", replies=[reply], token_digest=token_digest(token),
                         principal=principal, clip=clip)


def parked(book: ParkingBook, token: str, owner=None, **kw) -> ParkedSession:
    r = record(token, **kw)
    assert book.reserve(r.token_digest, r.session_id, r.principal, r.clip, owner) == (True, [])
    assert book.park(r)
    return r


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(parking, "PENDING_WAIT_S", 0.5)


def test_tokens_are_unguessable_and_only_the_right_one_claims():
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000 and min(len(t) for t in tokens) >= 32
    book = ParkingBook(60.0, 8, 1 << 30)
    token = new_token()
    r = parked(book, token, principal="key-a")

    async def go():
        with pytest.raises(Unauthorized):
            await book.claim("s", new_token(), "key-a")  # wrong token
        with pytest.raises(Unauthorized):
            await book.claim("s", token, "key-b")  # another API key's
        with pytest.raises(Unauthorized):
            await book.claim("t", token, "key-a")  # another session's token
        with pytest.raises(Unauthorized):
            await book.claim("s", None, "key-a")  # no token
        assert len(book) == 1  # refusals leave it parked
        assert await book.claim("s", token, "key-a") is r
        assert len(book) == 0
        with pytest.raises(Unauthorized):
            await book.claim("s", token, "key-a")  # claimed once

    asyncio.run(go())


def test_the_grace_period_ends_it_and_a_late_claim_says_so():
    clock = Clock()
    book = ParkingBook(60.0, 8, 1 << 30, clock=clock)
    token = new_token()
    r = parked(book, token)
    clock.t += 59.0
    assert book.sweep() == []
    clock.t += 2.0
    assert book.sweep() == [r]  # the deployment closes its replica state

    async def go():
        with pytest.raises(SessionLost, match="grace period"):
            await book.claim("s", token, None)
        with pytest.raises(Unauthorized):
            await book.claim("s", new_token(), None)

    asyncio.run(go())


def test_a_claim_waits_for_the_session_its_old_connection_is_still_parking():
    book = ParkingBook(60.0, 8, 1 << 30)
    token = new_token()
    r = record(token)

    async def go():
        assert book.reserve(r.token_digest, "s", None, False) == (True, [])
        claim = asyncio.ensure_future(book.claim("s", token, None))
        await asyncio.sleep(0.05)
        assert not claim.done()
        assert book.park(r)
        assert await claim is r

    asyncio.run(go())


def test_bounds_sessions_bytes_and_per_client():
    book = ParkingBook(60.0, 3, 1000, max_per_client=2)  # one record: 48 B of image + 10 B of video
    first = parked(book, "ta", principal="k1")
    parked(book, "tb", principal="k1")
    third = record("tc", principal="k1")
    assert book.reserve(third.token_digest, "s", "k1", False) == (True, [first])  # the client's oldest goes
    assert book.park(third)
    other = parked(book, "td", principal="k2")  # three parked: the parking is full
    fourth = record("te", principal="k3")
    assert book.reserve(fourth.token_digest, "s", "k3", False) == (False, [])  # never another client's
    assert len(book) == 3 and not book.park(fourth)
    fifth = record("tf", principal="k2")
    assert book.reserve(fifth.token_digest, "s", "k2", False) == (True, [other])  # full: its own oldest goes
    assert book.park(fifth) and len(book) == 3
    book.unreserve(fifth.token_digest)  # (room for the byte test)
    big = record("tg", principal="k4", video_bytes=2000)
    assert book.reserve(big.token_digest, "s", "k4", False) == (True, [])
    assert not book.park(big) and len(book) == 2  # over the byte budget: not kept, ends with its socket


def test_anonymous_clients_are_bounded_per_address_and_an_evicted_session_is_told_so():
    """Issue 31: without auth every client's principal is None; the bound is per owner (the
    address): one address dropping more than the cap evicts only its own oldest session, and
    that session's late claim says `evicted`, not that the grace period ended."""
    book = ParkingBook(60.0, 8, 1 << 30, max_per_client=2)
    victim = parked(book, "tv", owner="addr:10.0.0.2")
    mine = [parked(book, f"t{i}", owner="addr:10.0.0.1") for i in range(2)]
    third = record("t2")
    ok, evicted = book.reserve(third.token_digest, "s", None, False, "addr:10.0.0.1")
    assert ok and evicted == [mine[0]]
    assert book.park(third)

    async def go():
        with pytest.raises(SessionLost, match="evicted") as e:
            await book.claim("s", "t0", None)
        assert "grace period" not in e.value.message
        assert await book.claim("s", "tv", None) is victim  # the other address's session is still there

    asyncio.run(go())


def test_an_unknown_token_is_answered_at_once():
    """The parking never sleeps for a token it does not know (the claimant's connection waits):
    a flood of bogus claims holds none of its request slots."""
    book = ParkingBook(60.0, 8, 1 << 30)
    parked(book, new_token())

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(100):
            with pytest.raises(UnknownToken):
                await book.claim("s", new_token(), None)
        return loop.time() - t0

    assert asyncio.run(go()) < parking.PENDING_WAIT_S  # 100 claims, no wait among them (a bound, not a target)


def test_a_clip_session_is_claimed_by_its_client_and_session_id():
    book = ParkingBook(60.0, 8, 1 << 30)
    r = parked(book, new_token(), principal="addr:1.2.3.4", clip=True)

    async def go():
        with pytest.raises(SessionLost, match="waits to be resumed"):
            await book.claim("s", None, "addr:5.6.7.8", clip=True)
        with pytest.raises(SessionLost):
            await book.claim("other", None, "addr:1.2.3.4", clip=True)
        assert book.holds("s", "addr:1.2.3.4")
        assert await book.claim("s", None, "addr:1.2.3.4", clip=True) is r

    asyncio.run(go())


def test_a_new_clip_session_replaces_the_parked_one_and_a_claim_waits_for_its_park():
    """Their client's next call may reach the server before its previous socket's end was seen:
    the claim must get the newest clip session, never an older one of the same id (the
    connection asks again after a while: UnknownClip; then waits for the park once announced)."""
    book = ParkingBook(60.0, 8, 1 << 30)
    old = parked(book, new_token(), principal="addr:1.2.3.4", clip=True)
    assert book.discard_clip("s", "addr:1.2.3.4") == [old]  # the new session started: the old one goes
    assert not book.holds("s", "addr:1.2.3.4")
    new = record(new_token(), principal="addr:1.2.3.4", clip=True)

    async def go():
        with pytest.raises(UnknownClip):
            await book.claim("s", None, "addr:1.2.3.4", clip=True)  # its socket's end not seen yet
        book.reserve(new.token_digest, "s", "addr:1.2.3.4", True)
        claim = asyncio.ensure_future(book.claim("s", None, "addr:1.2.3.4", clip=True))
        await asyncio.sleep(0.01)
        assert not claim.done()  # announced: the claim waits for its park
        assert book.park(new)
        assert await claim is new

    asyncio.run(go())
