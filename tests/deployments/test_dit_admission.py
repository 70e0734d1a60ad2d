"""DiTDeployment's per-chunk admission, without Ray: the chunk cap and the growing reservation
of an open-ended session (no window, no declared length)."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from deployments.replicas.dit import DiTDeployment, DiTSlot
from deployments.errors import AttentionBound, Busy, SessionLimit
from deployments.replicas.session_table import SessionTable
from protocol.errors import ErrorCode

FRAME_BYTES = 100  # reservation per latent frame of the fake engine
RETRY_AFTER_S = 2.5


class FakeEngine:
    cfg = SimpleNamespace(local_attn_size=-1)

    @staticmethod
    def session_bytes(height: int, width: int, kv_frames: int) -> int:
        return FRAME_BYTES * kv_frames

    @staticmethod
    def footprint(height: int, width: int, kv_frames: int, total_latent_frames):
        return SimpleNamespace(held=FRAME_BYTES * kv_frames, working=0)


def replica(budget_bytes: int, max_chunks: int = 10):
    """A DiTDeployment's admission state with a fake engine (no model, no Serve)."""
    host = object.__new__(DiTDeployment.func_or_class)
    host._engine = FakeEngine()
    host._max_chunks = max_chunks
    host._max_attention_tokens = 10**9
    host._table = SessionTable(4, budget_bytes, idle_ttl_s=60.0, retry_after_s=RETRY_AFTER_S)
    return host


def hold(host, key: str, kv_frames: int, chunks: int) -> DiTSlot:
    slot = DiTSlot(session=None, height=32, width=48, kv_frames=kv_frames, chunks=chunks)
    host._table.admit(key, FRAME_BYTES * kv_frames)
    host._table.add(key, slot)
    return slot


def test_a_session_that_cannot_grow_is_busy_until_the_budget_frees():
    host = replica(budget_bytes=FRAME_BYTES * 9)
    grows = hold(host, "grows", kv_frames=3, chunks=1)  # open-ended: one chunk reserved at a time
    hold(host, "other", kv_frames=6, chunks=0)
    with pytest.raises(Busy) as refused:
        host._admit_chunk("grows", grows)  # needs 6 frames: 6 + 6 > 9
    err = pickle.loads(pickle.dumps(refused.value))  # as Ray carries it back to the ingress
    assert err.code is ErrorCode.BUSY and err.retry_after_s == RETRY_AFTER_S
    assert "cannot grow" in err.message and grows.kv_frames == 3
    host._table.pop("other")
    host._admit_chunk("grows", grows)
    assert grows.kv_frames == 6 and host._table.bytes_in_use == FRAME_BYTES * 6


def test_the_chunk_cap_is_session_limit():
    host = replica(budget_bytes=FRAME_BYTES * 100, max_chunks=2)
    slot = hold(host, "s", kv_frames=6, chunks=2)
    with pytest.raises(SessionLimit, match=r"its 2 chunks") as capped:
        host._admit_chunk("s", slot)
    assert capped.value.code is ErrorCode.SESSION_LIMIT


def test_an_open_ended_session_past_the_attention_bound_is_told_so():
    """Its own error (AttentionBound, too_large), not the chunk cap's."""
    host = replica(budget_bytes=FRAME_BYTES * 100)
    host._max_attention_tokens = 6 * 3  # 6 tokens per latent frame at 32x48: one chunk
    slot = hold(host, "s", kv_frames=3, chunks=1)
    with pytest.raises(AttentionBound, match="attention bound") as bound:
        host._admit_chunk("s", slot)
    assert pickle.loads(pickle.dumps(bound.value)).code is ErrorCode.TOO_LARGE


def test_declared_sessions_that_fit_get_full_attention_the_others_the_window():
    """Issue 15: with a window configured, the choice is per session, at open and at restore."""
    import numpy as np  # noqa: PLC0415

    from deployments.wire import SessionOptions  # noqa: PLC0415
    from model.factory import load_dit_engine  # noqa: PLC0415

    host = object.__new__(DiTDeployment.func_or_class)
    host._engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=6, sink_size=3)
    host._max_attention_tokens = 10**9
    fits = host._engine.footprint(32, 48, 30, 30).total
    host._table = SessionTable(4, fits, idle_ttl_s=60.0, retry_after_s=RETRY_AFTER_S)

    def options(total):
        return SessionOptions("s", "p", "d", (32, 48), 0, total, None, (480, 832))

    context = np.zeros((8, 64), np.float32)
    declared, open_ended, too_long = (host._session_spec(options(t), context) for t in (30, None, 60))
    assert declared.full_attention and not open_ended.full_attention and not too_long.full_attention
    assert host._engine.kv_frames(30, True) == 30 and host._engine.kv_frames(None, False) == 6
    need_full = host._engine.footprint(32, 48, 30, 30).held
    need_window = host._engine.footprint(32, 48, 6, None).held
    assert need_window < need_full
    host._engine = load_dit_engine("tiny", None, "float32", "cpu")  # no window configured: all full attention
    assert host._session_spec(options(None), context).full_attention


def test_the_session_budget_is_the_cap_minus_the_resident_bytes_minus_the_slack():
    """deployments/memory.session_budget: explicit GiB win; else cap - resident - 4 % of the cap
    (the 80 GB card's 0.75 share after the released DiT's 34.6 GiB: 22.4 GiB, room for the one
    windowed session benchmarks/capacity.py ran there: 17.66 + 4.21 GiB)."""
    from deployments.replicas.memory import GIB, session_budget  # noqa: PLC0415

    assert session_budget(3.0, 100 * GIB, 10 * GIB) == 3 * GIB
    cap, resident = int(0.75 * 79.2 * GIB), int(34.58 * GIB)
    budget = session_budget(None, cap, resident)
    assert budget == cap - resident - int(0.04 * cap)
    assert budget > int((17.66 + 4.21) * GIB)
    assert session_budget(None, GIB, 2 * GIB) == 0


def test_a_step_publishes_its_latents_before_the_cache_update():
    """DiTDeployment._step: `publish` sees the chunk's latents while its cache update is still
    pending; the update runs right after (before the replica's next job), and its time is
    reported with the next chunk."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from model.factory import load_dit_engine  # noqa: PLC0415
    from deployments.wire import ChunkStep  # noqa: PLC0415
    from model.session import DiTSessionSpec  # noqa: PLC0415

    host = object.__new__(DiTDeployment.func_or_class)
    host._engine = load_dit_engine("tiny", None, "float32", "cpu")
    host._replica = "r"
    host._table = SessionTable(1, None, idle_ttl_s=60.0, retry_after_s=1.0)  # no snapshots
    spec = DiTSessionSpec(context=torch.zeros(4, host._engine.cfg.text_dim), height=32, width=48)
    slot = DiTSlot(host._engine.open(spec), 32, 48, 6)
    seen = []

    def publish(reply):
        seen.append((reply.latents.shape, slot.session.pending_update is not None))

    y, poses, k = np.zeros((20, 3, 4, 6), np.float32), np.eye(4, dtype=np.float32)[None], np.array([[24.0, 24, 24, 16]], np.float32)
    first = host._step(slot, publish, "s", ChunkStep(y, poses, k, None))
    second = host._step(slot, publish, "s", ChunkStep(y, poses, k, None))
    assert seen == [((16, 3, 4, 6), True), ((16, 3, 4, 6), True)]
    assert slot.session.pending_update is None and slot.chunks == 2
    assert first.timings["previous_cache_update"] == 0.0 < second.timings["previous_cache_update"]
