"""Releases: the streams a connection's replicas may hold, and how each is freed (no Ray)."""
from __future__ import annotations

import asyncio

import numpy as np

from connection_fakes import FakeDeployment, FakeMetrics
from deployments.config import AppArgs
from deployments.ingress.guards.quotas import KeyQuota
from deployments.ingress.journal import SessionJournal
from deployments.ingress.lanes import Backends, Lane, ReplicaLanes
from deployments.ingress.releases import Releases
from deployments.ingress.stream import Stream, StreamState
from deployments.wire import SessionOptions
from deployments.log import get_log

SPEC = SessionOptions(session_id="s", prompt="p", image_digest="d", resolution=(32, 48), seed=42,
                      total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))
IMAGE = np.zeros((16, 16, 3), np.uint8)


def stream() -> Stream:
    return Stream(SPEC, SessionJournal(IMAGE, max_bytes=1 << 20), IMAGE)


def releases(log: list[str], quota: KeyQuota) -> Releases:
    backends = Backends(text=FakeDeployment("text", log, 0.0), vae=FakeDeployment("vae", log, 0.0),
                        dit=FakeDeployment("dit", log, 0.0))
    return Releases(ReplicaLanes(backends, Lane("dit"), Lane("vae"), AppArgs(), get_log("test")), quota, FakeMetrics())


def test_a_session_replaced_is_closed_on_both_deployments_and_the_connection_end_closes_the_rest():
    log: list[str] = []
    quota = KeyQuota(chunks_per_minute=None, max_sessions=1)

    async def go() -> tuple[Stream, Stream]:
        r = releases(log, quota)
        old, new = stream(), stream()
        r.adopt(old, replacing=None)
        r.adopt(new, replacing=old)  # one session at a time for this key: the replacement is no second one
        assert old.state is StreamState.CLOSED and new.state is StreamState.OPEN
        await asyncio.wait_for(old.release, 10.0)
        assert [e for e in log if e.endswith("start")] == ["dit.close start", "vae.close start"]
        await asyncio.wait_for(r.teardown(None, set()), 30.0)
        return old, new

    old, new = asyncio.run(go())
    assert new.state is StreamState.CLOSED
    assert sorted(e for e in log if e.endswith("start")) == ["dit.close start"] * 2 + ["vae.close start"] * 2
    quota.check_session()  # both ended: the key may start a session again (Busy otherwise)


def test_a_parked_session_is_not_closed_its_replicas_are_told_when_it_ends():
    log: list[str] = []

    async def go() -> Stream:
        r = releases(log, KeyQuota(chunks_per_minute=None, max_sessions=None))
        parked = stream()
        r.adopt(parked, replacing=None)
        parked.state = StreamState.CLOSED  # what ResumeBook.park does: the parking holds it now
        await asyncio.wait_for(r.teardown(parked, set()), 30.0)
        for _ in range(100):  # the replicas are told detached, bounded
            if len([e for e in log if e.endswith("end")]) == 2:
                break
            await asyncio.sleep(0.05)
        return parked

    asyncio.run(go())
    assert sorted(e for e in log if e.endswith("start")) == ["dit.expect_release start", "vae.expect_release start"]
