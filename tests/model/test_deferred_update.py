"""DiTEngine.step(defer_update=True) + finish_chunk: the chunk's latents before its cache-update
call, the same calls in the same order, so the same numbers as the plain step (prompt
steering and windows included)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.factory import load_dit_engine
from model.session import DiTSessionSpec

CHUNKS = 4


def _chunk_inputs(k: int, gen: torch.Generator):
    poses = np.tile(np.eye(4, dtype=np.float32), (9 if k == 0 else 12, 1, 1))
    poses[:, 0, 3] = 0.03 * np.arange(len(poses)) + k
    return (torch.randn(20, 3, 8, 14, generator=gen), poses,
            np.tile([[50.0, 50, 56, 32]], (len(poses), 1)).astype(np.float32))


def _session(engine, total, trace=True):
    gen = torch.Generator().manual_seed(2)
    spec = DiTSessionSpec(context=torch.randn(6, engine.cfg.text_dim, generator=gen), height=64, width=112,
                          seed=4, total_latent_frames=total)
    session = engine.open(spec)
    session.trace = [] if trace else None
    return session


def _run(engine, defer: bool, total, steer_at=None, finish=True, trace=True):
    session = _session(engine, total, trace)
    gen, out = torch.Generator().manual_seed(8), []
    new_context = torch.randn(5, engine.cfg.text_dim, generator=torch.Generator().manual_seed(9))
    for k in range(CHUNKS):
        if k == steer_at:
            engine.update_prompt(session, new_context)
        y, poses, intrinsics = _chunk_inputs(k, gen)
        out.append(engine.step(session, y, poses, intrinsics, defer_update=defer).latents)
        if defer and finish:
            assert session.pending_update is not None or k == CHUNKS - 1
            engine.finish_chunk(session)
    calls = [(c["kind"], c.get("current_start"), float(c["t"].flatten()[0]) if "t" in c else None)
             for c in session.trace or []]
    return out, calls


@pytest.mark.parametrize("window, total", [(None, 3 * CHUNKS), (None, None), ((6, 3), None)])
@pytest.mark.parametrize("steer_at", [None, 2])
@pytest.mark.parametrize("finish", [True, False])
def test_deferred_updates_give_the_plain_steps_numbers(window, total, steer_at, finish):
    """`finish=False`: the next step (or the prompt update) runs the pending update first."""
    local, sink = window or (None, None)
    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=local, sink_size=sink)
    plain, plain_calls = _run(engine, False, total, steer_at)
    deferred, deferred_calls = _run(engine, True, total, steer_at, finish)
    assert all(torch.equal(a, b) for a, b in zip(plain, deferred))
    if finish:
        assert deferred_calls == plain_calls  # the same DiT calls, in the same order
    else:  # the last chunk's update is still pending: every call before it is the same
        assert deferred_calls == plain_calls[:len(deferred_calls)]
        assert len(plain_calls) - len(deferred_calls) == 1  # the last chunk's update


def test_a_closed_session_drops_its_pending_update():
    engine = load_dit_engine("tiny", None, "float32", "cpu")
    session = _session(engine, None)
    y, poses, intrinsics = _chunk_inputs(0, torch.Generator().manual_seed(1))
    engine.step(session, y, poses, intrinsics, defer_update=True)
    assert session.pending_update is not None
    engine.close(session)
    assert session.pending_update is None and engine.finish_chunk(session) == 0.0


@pytest.mark.parametrize("window", [None, (6, 3)])
@pytest.mark.parametrize("defer", [False, True])
def test_untraced_cache_updates_only_write_the_kv_and_give_the_same_numbers(window, defer, monkeypatch):
    """Without a trace the engine's cache updates run CausalDiT.write_kv (no last-block attention,
    FFN or head): the same latents as the traced run's whole t = 0 calls, windows included."""
    local, sink = window or (None, None)
    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=local, sink_size=sink)
    whole, calls = _run(engine, defer, None)
    kv_only = []
    write_kv = engine.dit.write_kv
    monkeypatch.setattr(engine.dit, "write_kv", lambda *a: kv_only.append(float(a[1])) or write_kv(*a))
    written, _ = _run(engine, defer, None, trace=False)
    assert kv_only == [0.0] * CHUNKS and sum(t == 0.0 for *_, t in calls) == CHUNKS
    assert all(torch.equal(a, b) for a, b in zip(whole, written))
