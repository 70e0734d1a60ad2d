"""model/dit/kv_cache.py: write / roll / window semantics of spec A.5 on toy tensors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from model.config import PRESETS
from model.dit.caches import DiTCaches
from model.dit.kv_cache import CrossAttnCache, SelfAttnKVCache
from support import load_golden


def chunk(tag: float, n: int, heads: int = 2, head_dim: int = 4) -> torch.Tensor:
    """A chunk of n tokens whose token i holds tag + i (easy to follow through rolls)."""
    return (tag + torch.arange(n, dtype=torch.float32)).view(n, 1, 1).expand(n, heads, head_dim).clone()


def token_ids(cache_slice: torch.Tensor) -> list[float]:
    return cache_slice[:, 0, 0].tolist()


def test_rolling_window_of_golden_tiny_03():
    """local 6 frames, sink 3, 28 tokens/frame: local end 0 -> 84 -> 168, then stays at 168."""
    g = load_golden("tiny_03_local6_sink3.pt")
    fs = g["meta"]["frame_seqlen"]
    cache = SelfAttnKVCache(6 * fs, 2, 4, torch.float32, "cpu", rolling=True, sink_tokens=3 * fs)
    for c, ch in enumerate(g["chunks"]):
        calls = ch["steps"] + [ch["cache_update"]]
        for k, call in enumerate(calls):
            assert (cache.global_end, cache.local_end) == (
                call["kv_global_end_before"][0], call["kv_local_end_before"][0],
            )
            tag = 1000.0 * c + 100.0 * k
            k_vis, v_vis = cache.update(chunk(tag, 3 * fs), chunk(-tag, 3 * fs), call["current_start"])
            assert (cache.global_end, cache.local_end) == (
                call["kv_global_end_after"][0], call["kv_local_end_after"][0],
            )
            assert k_vis.shape[0] == cache.local_end and torch.equal(k_vis, cache.k[: cache.local_end])
            # the chunk always sees itself in the last slots
            assert token_ids(k_vis[-3 * fs :]) == token_ids(chunk(tag, 3 * fs))
        if c >= 2:  # sink = chunk 0's clean K (its t = 0 call), then the current chunk
            assert token_ids(cache.k[: 3 * fs]) == token_ids(chunk(400.0, 3 * fs))
            assert token_ids(cache.v[3 * fs :]) == token_ids(chunk(-(1000.0 * c + 400.0), 3 * fs))


def test_roll_shifts_middle_tokens():
    """capacity 5, sink 1, chunks of 2: a0 a1 | b0 b1 | c0 c1 -> a0 b0 b1 c0 c1 (a1 evicted)."""
    cache = SelfAttnKVCache(5, 1, 1, torch.float32, "cpu", rolling=True, sink_tokens=1)
    for i, tag in enumerate((10.0, 20.0, 30.0)):
        cache.update(chunk(tag, 2, 1, 1), chunk(tag, 2, 1, 1), start=2 * i)
    assert token_ids(cache.k) == [10.0, 20.0, 21.0, 30.0, 31.0]
    assert (cache.global_end, cache.local_end) == (6, 5)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(2, 24),
    sink=st.integers(0, 8),
    n=st.integers(1, 8),
    chunks=st.integers(1, 8),
    repeats=st.integers(1, 3),
    max_attention=st.one_of(st.none(), st.integers(1, 30)),
)
def test_window_keeps_sink_plus_latest_tokens(capacity, sink, n, chunks, repeats, max_attention):
    """Independent model: the cache holds the first `sink` tokens of the stream and the most
    recent ones; each call overwrites the current chunk; attention sees the last window."""
    assume(sink + n <= capacity)
    cache = SelfAttnKVCache(capacity, 1, 1, torch.float32, "cpu", rolling=True, sink_tokens=sink,
                            max_attention_size=max_attention)
    stream: list[float] = []
    for c in range(chunks):
        for r in range(repeats):
            new = [1000.0 * c + 10.0 * r + i for i in range(n)]
            k_vis, _ = cache.update(torch.tensor(new).view(n, 1, 1), torch.zeros(n, 1, 1), start=c * n)
            current = stream + new
            kept = current if len(current) <= capacity else current[:sink] + current[len(current) - (capacity - sink):]
            visible = kept if max_attention is None else kept[max(0, len(kept) - max_attention):]
            assert token_ids(k_vis) == visible
        stream += new


def test_chunk_larger_than_window_is_rejected():
    cache = SelfAttnKVCache(6, 1, 1, torch.float32, "cpu", rolling=True, sink_tokens=3)
    cache.update(torch.zeros(3, 1, 1), torch.zeros(3, 1, 1), 0)
    cache.update(torch.zeros(3, 1, 1), torch.zeros(3, 1, 1), 3)
    with pytest.raises(ValueError, match="does not fit"):
        cache.update(torch.zeros(4, 1, 1), torch.zeros(4, 1, 1), 6)


def test_unbounded_cache_grows_and_keeps_history():
    cfg = PRESETS["tiny"].dit
    caches = DiTCaches.allocate(cfg, frame_seqlen=4, total_latent_frames=None, dtype=torch.float32, device="cpu")
    first = caches.self_attn[0]
    assert first.capacity == 12  # one chunk when the length is unknown
    for c in range(3):
        k_vis, v_vis = first.update(chunk(100.0 * c, 12, 2, 64), chunk(-100.0 * c, 12, 2, 64), start=12 * c)
    assert first.capacity >= 36 and (first.global_end, first.local_end) == (36, 36)
    assert token_ids(k_vis) == sum((token_ids(chunk(100.0 * c, 12)) for c in range(3)), [])
    assert token_ids(v_vis) == sum((token_ids(chunk(-100.0 * c, 12)) for c in range(3)), [])
    caches.ensure_capacity(200)
    assert all(c.capacity >= 200 for c in caches.self_attn)
    assert token_ids(first.k[:36]) == token_ids(k_vis)


def test_max_attention_size_shrinks_the_visible_window():
    cache = SelfAttnKVCache(12, 1, 1, torch.float32, "cpu", max_attention_size=5)
    cache.update(chunk(0.0, 4, 1, 1), chunk(0.0, 4, 1, 1), 0)
    k_vis, _ = cache.update(chunk(10.0, 4, 1, 1), chunk(10.0, 4, 1, 1), 4)
    assert token_ids(k_vis) == [3.0, 10.0, 11.0, 12.0, 13.0]


def test_allocation_sizes_and_bytes():
    cfg = PRESETS["tiny"].dit
    full = DiTCaches.allocate(cfg, 28, 6, torch.float32, "cpu")
    assert [c.capacity for c in full.self_attn] == [168, 168] and not full.self_attn[0].rolling
    assert full.cross_attn[0].k.shape == (512, 2, 64)
    # 2 layers x (k + v) x (168 self + 512 cross tokens) x 128 wide x 4 bytes
    assert full.nbytes == DiTCaches.kv_bytes(cfg, 28, 6, torch.float32) == 2 * 2 * (168 + 512) * 128 * 4
    windowed = DiTCaches.allocate(cfg.with_window(6, 3), 28, 12, torch.bfloat16, "cpu")
    assert windowed.self_attn[1].capacity == 168 and windowed.self_attn[1].sink_tokens == 84
    assert windowed.self_attn[0].k.dtype == torch.bfloat16
    assert windowed.nbytes == DiTCaches.kv_bytes(cfg, 28, 6, torch.bfloat16)
    released = PRESETS["lingbot-world-fast"].dit
    # 81 frames at 464x832: 21 latent frames of 1508 tokens, bf16
    assert DiTCaches.kv_bytes(released, 1508, 21, torch.bfloat16) == 40 * 2 * (1508 * 21 + 512) * 5120 * 2


def test_reset_forgets_the_history():
    cfg = PRESETS["tiny"].dit
    caches = DiTCaches.allocate(cfg, 4, 6, torch.float32, "cpu")
    caches.self_attn[0].update(chunk(5.0, 12, 2, 64), chunk(5.0, 12, 2, 64), 0)
    caches.cross_attn[0].store(torch.ones(512, 2, 64), torch.ones(512, 2, 64))
    assert caches.cross_attn[0].is_init and caches.global_end == 12
    caches.reset()
    assert (caches.global_end, caches.local_end) == (0, 0)
    assert not caches.cross_attn[0].is_init
    # the old tokens are never visible again: the next chunk sees only itself
    k_vis, v_vis = caches.self_attn[0].update(chunk(7.0, 6, 2, 64), chunk(-7.0, 6, 2, 64), 0)
    assert token_ids(k_vis) == token_ids(chunk(7.0, 6)) and token_ids(v_vis) == token_ids(chunk(-7.0, 6))


def test_two_sessions_never_share_storage():
    cfg = PRESETS["tiny"].dit
    a = DiTCaches.allocate(cfg, 4, 6, torch.float32, "cpu")
    b = DiTCaches.allocate(cfg, 4, 6, torch.float32, "cpu")
    ptrs = lambda cs: {t.data_ptr() for c in cs.self_attn + cs.cross_attn for t in (c.k, c.v)}  # noqa: E731
    assert len(ptrs(a)) == 8 and not ptrs(a) & ptrs(b)
    a.self_attn[0].update(chunk(1.0, 12, 2, 64), chunk(1.0, 12, 2, 64), 0)
    assert b.self_attn[0].k.abs().sum() == 0 and b.global_end == 0


def test_cross_cache_store():
    cache = CrossAttnCache(8, 2, 4, torch.bfloat16, "cpu")
    assert not cache.is_init
    k = torch.randn(8, 2, 4)
    cache.store(k, 2 * k)
    assert cache.is_init and cache.k.dtype == torch.bfloat16
    assert torch.equal(cache.k, k.bfloat16()) and torch.equal(cache.v, (2 * k).bfloat16())


def test_invalid_sizes():
    cfg = PRESETS["tiny"].dit
    with pytest.raises(ValueError, match="frame_seqlen"):
        DiTCaches.allocate(cfg, 0, 6, torch.float32, "cpu")
    with pytest.raises(ValueError, match="total_latent_frames"):
        DiTCaches.allocate(cfg, 4, 0, torch.float32, "cpu")
    with pytest.raises(ValueError, match="max_attention_size"):
        SelfAttnKVCache(4, 1, 1, torch.float32, "cpu", max_attention_size=0)
