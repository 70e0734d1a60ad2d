"""A restore (the journal's replay: a fork or rewind below the head without a snapshot, a
session leaving the prefix store, a lost replica) replays its chunks one compute job each
(issue 43, item 3): another session's call queued on the replica while the replay runs goes
between two replayed chunks, not behind all of them; and the session rebuilt that way goes on
exactly like the one it was rebuilt from. The replica classes without Ray (tiny model, CPU);
order of the model calls, no timing."""
from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest

from deployments.config import ModelArgs, SessionArgs
from deployments.replicas import dit as dit_module
from deployments.replicas import session_host
from deployments.replicas import vae as vae_module
from deployments.wire import ChunkStep, PastChunk, SessionOptions

MODEL = ModelArgs(preset="tiny", device="cpu", warmup=False, size_buckets=["32*48"], default_size="32*48")
K = np.array([[40, 40, 24, 16.0]], np.float32)
CHUNKS = 6


@pytest.fixture(autouse=True)
def replica_context(monkeypatch):
    ctx = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="test-replica"))
    monkeypatch.setattr(session_host.serve, "get_replica_context", lambda: ctx)


def _new(cls):
    cls = cls.func_or_class
    return cls.__new__(cls)


def _options(sid: str, raw_frames: bool = False) -> SessionOptions:
    return SessionOptions(session_id=sid, prompt="a cat", image_digest="d", resolution=(32, 48), seed=1,
                          total_latent_frames=None, translation_scale=None, intrinsics_resolution=(32, 48),
                          raw_frames=raw_frames)


def _chunk(k: int):
    y = np.random.default_rng(k).standard_normal((20, 3, 4, 6)).astype(np.float32)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 0, 3] = 0.05 * np.arange(12) + k
    return y, poses, np.tile(K, (12, 1))


class Gate:
    """Holds the replay's first model call in the model thread until the test lets it go, and
    logs who called the model, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.log = loop, []
        self.started, self.go_on = asyncio.Event(), threading.Event()

    def replayed(self, n: int = 1) -> None:
        self.log += ["replay"] * n
        if not self.started.is_set():
            self.loop.call_soon_threadsafe(self.started.set)
            assert self.go_on.wait(30)


async def _queue_behind_the_replay(host, gate: Gate, other) -> asyncio.Future:
    """`other()` (another session's call) queued on the replica while the replay's first chunk runs."""
    await gate.started.wait()
    call = asyncio.ensure_future(other())
    for _ in range(1000):  # until it waits for the compute lock
        if host._lock.waiting:
            break
        await asyncio.sleep(0.001)
    assert host._lock.waiting == 1
    gate.go_on.set()
    return call


def test_a_vae_restore_lets_another_sessions_call_run_between_its_chunks():
    image = np.random.default_rng(3).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    latents = [np.random.default_rng(10 + k).standard_normal((16, 3, 4, 6)).astype(np.float32)
               for k in range(CHUNKS + 1)]

    async def go():
        vae = _new(vae_module.VaeDeployment)
        await vae.__init__(MODEL, SessionArgs(), 8)
        await vae.open("src", _options("src", raw_frames=True), image)
        await vae.open("other", _options("other", raw_frames=True), image)
        for k in range(CHUNKS):
            await vae.condition("src")
            await vae.decode("src", latents[k])
        gate = Gate(asyncio.get_running_loop())
        engine = vae._engine
        other = vae._table.get("other").session
        condition, decode = engine.condition, engine.decode

        def logged(real):
            def call(session, *args):
                if session is other:
                    gate.log.append("other")
                elif session is not vae._table.get("src").session:
                    gate.replayed()
                return real(session, *args)
            return call

        engine.condition, engine.decode = logged(condition), logged(decode)
        restore = asyncio.ensure_future(vae.restore("r", _options("r", raw_frames=True), image, CHUNKS, latents[:CHUNKS]))
        call = await _queue_behind_the_replay(vae, gate, lambda: vae.condition("other"))
        await asyncio.gather(restore, call)
        engine.condition, engine.decode = condition, decode
        nxt = [(await vae.condition(k), (await vae.decode(k, latents[CHUNKS]))["video"]) for k in ("src", "r")]
        return gate.log, nxt

    log, ((y_src, video_src), (y_r, video_r)) = asyncio.run(go())
    print(f"RELIABILITY vae replay of {CHUNKS} chunks (conditions + decodes): model calls in order {log}")
    assert log.count("replay") == 2 * CHUNKS
    assert log.index("other") == 1  # right after the replay's first call, not behind its 2k calls
    np.testing.assert_array_equal(y_r, y_src)  # the rebuilt session goes on exactly
    assert video_r == video_src


def test_a_dit_restore_lets_another_sessions_chunk_run_between_its_chunks():
    async def go():
        dit = _new(dit_module.DiTDeployment)
        await dit.__init__(MODEL, SessionArgs())
        context = np.random.default_rng(0).standard_normal((6, dit._engine.cfg.text_dim)).astype(np.float32)
        await dit.open("src", _options("src"), context)
        await dit.open("other", _options("other"), context)
        past, noise = [], None
        for k in range(CHUNKS):
            y, poses, intrinsics = _chunk(k)
            out = await dit.step("src", ChunkStep(y, poses, intrinsics))
            past.append(PastChunk(poses, intrinsics, y, out.latents))
            noise = out.noise
        gate = Gate(asyncio.get_running_loop())
        engine = dit._engine
        replay, step = engine.replay, engine.step

        def replayed(session, spec, chunks, state):
            gate.replayed(len(chunks))
            return replay(session, spec, chunks, state)

        def stepped(session, *args, **kwargs):
            gate.log.append("other" if session is dit._table.get("other").session else "src")
            return step(session, *args, **kwargs)

        engine.replay, engine.step = replayed, stepped
        restore = asyncio.ensure_future(dit.restore("r", _options("src"), context, past, noise))
        call = await _queue_behind_the_replay(dit, gate, lambda: dit.step("other", ChunkStep(*_chunk(0))))
        await asyncio.gather(restore, call)
        engine.replay, engine.step = replay, step
        nxt = [(await dit.step(k, ChunkStep(*_chunk(CHUNKS)))).latents for k in ("src", "r")]
        return gate.log, nxt

    log, (src, rebuilt) = asyncio.run(go())
    print(f"RELIABILITY dit replay of {CHUNKS} chunks: model calls in order {log}")
    assert log.count("replay") == CHUNKS
    assert log.index("other") == 1  # right after the replay's first chunk, not behind all of them
    np.testing.assert_array_equal(rebuilt, src)  # the rebuilt session's next chunk, bit for bit
