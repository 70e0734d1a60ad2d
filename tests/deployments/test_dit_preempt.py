"""DiTDeployment.preempt (drive/binding.py): the replica gives a session's chunk up at its next
denoising call, or before it starts, answering `Preempted` with the session as before it; the
chunk made next equals the one of a session never preempted. Only the chunk named, only while
it is not done; counted in `stats()["calls"]["preempted"]`. The replica class without Ray."""
from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest

from deployments.config import ModelArgs, SessionArgs
from deployments.errors import Preempted
from deployments.replicas import dit as dit_module
from deployments.replicas import session_host
from deployments.wire import ChunkStep, SessionOptions

MODEL = ModelArgs(preset="tiny", device="cpu", warmup=False, size_buckets=["32*48"], default_size="32*48")
K = np.array([[40, 40, 24, 16.0]], np.float32)


@pytest.fixture
def replica(monkeypatch):
    ctx = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="test-replica"))
    monkeypatch.setattr(session_host.serve, "get_replica_context", lambda: ctx)
    cls = dit_module.DiTDeployment.func_or_class
    return cls.__new__(cls)


def _options(sid: str) -> SessionOptions:
    return SessionOptions(session_id=sid, prompt="a cat", image_digest="d", resolution=(32, 48), seed=1,
                          total_latent_frames=None, translation_scale=None, intrinsics_resolution=(32, 48))


def _chunk(k: int, turn: float = 0.0):
    y = np.random.default_rng(k).standard_normal((20, 3, 4, 6)).astype(np.float32)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 0, 3] = 0.05 * np.arange(12) + k
    poses[:, 2, 3] = turn * np.arange(12)
    return y, poses, np.tile(K, (12, 1))


def test_a_preempted_chunk_is_given_up_and_made_again_as_if_never_started(replica):
    async def go():
        dit = replica
        await dit.__init__(MODEL, SessionArgs())
        context = np.random.default_rng(0).standard_normal((6, dit._engine.cfg.text_dim)).astype(np.float32)
        await dit.open("a", _options("a"), context)
        await dit.open("b", _options("b"), context)
        plain = [(await dit.step("b", ChunkStep(*_chunk(k)))).latents for k in range(3)]
        ours = [(await dit.step("a", ChunkStep(*_chunk(0)))).latents]
        assert await dit.preempt("a", 0) is False  # chunk 0 is done
        assert await dit.preempt("a", 2) is False  # not the chunk to run next
        assert await dit.preempt("nobody", 1) is False
        assert await dit.preempt("a", 1) is True  # before it starts: given up at its first call
        with pytest.raises(Preempted):
            await dit.step("a", ChunkStep(*_chunk(1, turn=0.3)))
        ours.append((await dit.step("a", ChunkStep(*_chunk(1)))).latents)  # made again, with other poses

        # while it runs: asked while its first denoising call is held in the model thread
        started, go_on = asyncio.Event(), threading.Event()
        loop = asyncio.get_running_loop()
        real = dit._engine.dit.forward

        def forward(*args, **kwargs):
            loop.call_soon_threadsafe(started.set)
            go_on.wait(30)
            return real(*args, **kwargs)

        dit._engine.dit.forward = forward
        running = asyncio.ensure_future(dit.step("a", ChunkStep(*_chunk(2, turn=0.3))))
        await started.wait()
        assert await dit.preempt("a", 2) is True
        go_on.set()
        with pytest.raises(Preempted):
            await running
        dit._engine.dit.forward = real
        ours.append((await dit.step("a", ChunkStep(*_chunk(2)))).latents)
        stats = await dit.stats()
        await dit.close("a")
        await dit.close("b")
        return plain, ours, stats

    plain, ours, stats = asyncio.run(go())
    assert all(np.array_equal(p, o) for p, o in zip(plain, ours))
    assert stats["calls"]["preempted"] == 2
