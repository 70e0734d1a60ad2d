"""VAE admission by bytes (issue 13): an app whose VAE budget holds one 32x48 session. The
replica reserves each session's footprint (its caches at the session's size plus one call's
activations); the second session gets `busy` with retry_after_s end to end, and is admitted
once the first ends."""
from __future__ import annotations

import asyncio

import pytest

from model.factory import load_vae_engine
from model.vae.footprint import CacheLayout
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

GIB = 1024**3
APP = "vaebudget"


@pytest.fixture(scope="module")
def need():
    """One session's footprint at the test size, as the replica computes it."""
    return CacheLayout.probe(load_vae_engine("tiny", None, "float32", "cpu"), (32, 48)).footprint(32, 48)


@pytest.fixture(scope="module")
def vae_budget_app(extra_app, need):
    budget = need.total + need.held // 2  # one session fits, two do not
    yield extra_app(APP, dit={"num_replicas": 1}, sessions={"vae_budget_gib": budget / GIB})
    from ray import serve

    serve.delete(APP)


def test_a_session_beyond_the_vae_budget_is_busy_not_out_of_memory(vae_budget_app, example, need, stats_of):
    _, connect = vae_budget_app
    (idle,) = stats_of(APP, "VaeDeployment")
    assert idle["budget_bytes"] == int((need.total + need.held // 2) / GIB * GIB)
    assert idle["cache_bytes"] == 0

    async def go():
        async with connect() as a, connect() as b:
            start = SessionStart(example.image, example.prompt, num_frames=example.num_frames)
            await a.send(encode(infer_request("first", *example.chunk(0), start=start)))
            first = await a.recv()
            (held,) = await asyncio.to_thread(stats_of, APP, "VaeDeployment")
            await b.send(encode(infer_request("second", *example.chunk(0), start=start)))
            second = await b.recv()
            await a.reset("first")
            await b.send(encode(infer_request("second", *example.chunk(0), start=start)))
            admitted = await b.recv()
            await b.reset("second")
        return first, held, second, admitted

    first, held, second, admitted = asyncio.run(go())
    assert isinstance(first, FrameReply) and first.resolution == (32, 48), first
    # the reservation is the footprint's bytes, not a count
    assert held["cache_bytes"] == need.held and held["reserved_bytes"] == need.total, held
    assert isinstance(second, ErrorReply) and second.code is ErrorCode.BUSY and second.retry_after_s > 0, second
    assert isinstance(admitted, FrameReply), admitted
