"""The text encoder's cache is per principal (issue 43, item 4): a prompt another API key (or,
without auth, another client address) encoded is encoded again, so the time of an encode
(`stage_durations.text_encode`: a cache hit 6-10 ms, an encode 130-180 ms on a CPU) tells no
one whether another tenant used that prompt. Connections against recording fakes and the text
encoder's replica class with a counting engine (no Ray, no model)."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Optional

import numpy as np

from deployments.config import AppArgs
from deployments.ingress.connection import Backends, Connection
from deployments.replicas.compute_thread import ComputeThread
from deployments.replicas.text_encoder import TextEncoderDeployment
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request
from connection_fakes import FakeDeployment, FakeMetrics, ReplicaHandle, ScriptedSocket

PROMPT = "a prompt only tenant A has used"


class CountingEngine:
    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, prompt: str):
        import torch
        self.encoded.append(prompt)
        return torch.zeros(4, 64)


class _Log:
    def info(self, *args, **kwargs) -> None:
        pass


def _text_replica(engine: CountingEngine) -> TextEncoderDeployment:
    cls = TextEncoderDeployment.func_or_class
    replica = cls.__new__(cls)
    replica._engine, replica._log = engine, _Log()
    replica._cache, replica._cache_size = OrderedDict(), 64
    replica._lock, replica._thread = asyncio.Lock(), ComputeThread("test-text")
    return replica


async def _session(backends: Backends, example, sid: str, key_id: Optional[str], client: Optional[str],
                   prompt: str = PROMPT) -> FrameReply:
    """One connection of that principal: a session's first chunk, then the client leaves."""
    ws = ScriptedSocket()
    conn = Connection(ws, backends, AppArgs(), Limits(), CameraServerConfig(model="tiny"), FakeMetrics(),
                      key_id=key_id, client=client)
    run = asyncio.ensure_future(conn.run())
    poses, intrinsics = example.chunk(0)
    ws.send(encode(infer_request(sid, poses, intrinsics, start=SessionStart(example.image, prompt, num_frames=33))))
    replies = await ws.wait_for(lambda sent: [r for r in sent if isinstance(r, FrameReply)])
    ws.leave()
    await asyncio.wait_for(run, 30)
    return replies[0]


def _backends(engine: CountingEngine) -> Backends:
    log: list[str] = []
    return Backends(text=ReplicaHandle(_text_replica(engine)), vae=FakeDeployment("vae", log, 0.0),
                    dit=FakeDeployment("dit", log, 0.0))


def test_one_api_keys_prompts_are_not_answered_from_another_keys_cache(example):
    engine = CountingEngine()
    backends = _backends(engine)

    async def go():
        await _session(backends, example, "a1", "key-A", "10.0.0.1")
        await _session(backends, example, "b1", "key-B", "10.0.0.1")  # same address, another key
        await _session(backends, example, "a2", "key-A", "10.0.0.9")  # key A again, from elsewhere

    asyncio.run(go())
    print(f"RELIABILITY text cache: key A, key B, key A again encode the same prompt: the encoder ran "
          f"{len(engine.encoded)} times")
    assert engine.encoded == [PROMPT, PROMPT]  # B's is computed, as a fresh prompt's; A's second is A's hit


def test_without_auth_the_cache_is_per_client_address(example):
    engine = CountingEngine()
    backends = _backends(engine)

    async def go():
        await _session(backends, example, "s", None, "10.0.0.1")
        await _session(backends, example, "s", None, "10.0.0.2")
        await _session(backends, example, "s", None, "10.0.0.1")

    asyncio.run(go())
    assert engine.encoded == [PROMPT, PROMPT]


def test_the_cache_is_keyed_by_owner_and_prompt():
    engine = CountingEngine()
    replica = _text_replica(engine)

    async def go():
        a = await replica.encode("p", "owner-a")
        assert await replica.encode("p", "owner-a") is a
        b = await replica.encode("p", "owner-b")
        assert b is not a and np.array_equal(a, b)

    asyncio.run(go())
    assert engine.encoded == ["p", "p"]
