"""DiTEngine.step(should_stop=...): a chunk given up between its denoising calls leaves the
session as it was, so the chunk made again (with other poses: a driven session whose keys
changed) equals the one a session that never started the first try makes (CPU float32)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.dit.caches import KVCacheConfig
from model.engine_api import ChunkPreempted
from model.factory import load_dit_engine
from support import open_tiny_dit_session

CHUNKS = 5  # with the (6, 3) window the cache is full from chunk 3 on, and chunk 4 wraps the ring


def _inputs(k: int, turn: float):
    gen = torch.Generator().manual_seed(100 + k)
    poses = np.tile(np.eye(4, dtype=np.float32), (9 if k == 0 else 12, 1, 1))
    poses[:, 0, 3] = 0.03 * np.arange(len(poses)) + k
    poses[:, 2, 3] = turn * np.arange(len(poses))
    return (torch.randn(20, 3, 8, 14, generator=gen), poses,
            np.tile([[50.0, 50, 56, 32]], (len(poses), 1)).astype(np.float32))


def _stop_after(calls: int):
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > calls
    return should_stop, asked


def _run(engine, total, preempt_at: dict[int, int], defer: bool):
    """Every chunk k in `preempt_at` first starts with other poses and is given up after
    preempt_at[k] denoising calls, then made with its own."""
    session, out = open_tiny_dit_session(engine, total), []
    for k in range(CHUNKS):
        if k in preempt_at:
            y, poses, intrinsics = _inputs(k, turn=0.2)
            stop, asked = _stop_after(preempt_at[k])
            camera_before = (session.camera.anchor, session.camera.last_pose, session.camera.chunk_index)
            with pytest.raises(ChunkPreempted):
                engine.step(session, y, poses, intrinsics, defer_update=defer, should_stop=stop)
            assert len(asked) == preempt_at[k] + 1
            after = (session.camera.anchor, session.camera.last_pose, session.camera.chunk_index)
            assert after[2] == camera_before[2] == k  # the track's position too, not only its poses
            assert all(a is None and b is None or np.array_equal(a, b) for a, b in zip(after[:2], camera_before[:2]))
        y, poses, intrinsics = _inputs(k, turn=0.0)
        out.append(engine.step(session, y, poses, intrinsics, defer_update=defer).latents)
        assert session.chunk_index == k + 1
    engine.finish_chunk(session)
    return out


@pytest.mark.parametrize("window, kv, total", [
    (None, None, None), (None, None, 3 * CHUNKS), ((6, 3), None, None), ((6, 3), KVCacheConfig(ring=True), None)],
    ids=["full-open", "full-planned", "window", "window-ring"])
@pytest.mark.parametrize("defer", [False, True])
def test_a_chunk_given_up_and_made_again_equals_one_never_given_up(window, kv, total, defer):
    local, sink = window or (None, None)
    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=local, sink_size=sink, kv=kv)
    plain = _run(engine, total, {}, defer)
    # given up before its first call, after one, after three (the last denoising call not run)
    preempted = _run(engine, total, {1: 0, 2: 1, 4: 3}, defer)
    assert all(torch.equal(a, b) for a, b in zip(plain, preempted))


def test_should_stop_is_not_asked_for_the_cache_update():
    """Once its 4 denoising calls ran the chunk is done: the cache update is never given up."""
    engine = load_dit_engine("tiny", None, "float32", "cpu")
    session = open_tiny_dit_session(engine, None)
    asked = []
    y, poses, intrinsics = _inputs(0, 0.0)
    engine.step(session, y, poses, intrinsics, should_stop=lambda: asked.append(1) or False)
    assert len(asked) == len(engine.timesteps) == 4
