"""The FP8 attention's code cache (model/dit/kv_codes.py, `KVCacheConfig("fp8_codes")`): the slots of the
exact cache, every row within e4m3's rounding of one running descale per tensor, the descale
growing with a louder chunk (the cached codes rescaled), half the bytes, and the
fast block attending through it as through the per-call quantization (a stand-in cuDNN)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from model.accel import AccelOptions, optimize_dit
from model.config import DiTConfig
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.dit.caches import DiTCaches, KVCacheConfig
from model.dit.kv_cache import SelfAttnKVCache
from model.dit.e4m3 import E4M3, E4M3_MAX
from model.dit.kv_codes import Fp8CodesKVCache, append_codes_reference

E4M3_REL = 2.0**-4  # half an ulp of a 3-bit mantissa, relative


def _within_e4m3(got: torch.Tensor, want: torch.Tensor, descale: float, roundings: int = 1) -> bool:
    # each rounding: half an ulp relative, or e4m3's subnormal step (2^-9 of 448 * descale) near zero
    return bool(torch.all((got - want).abs() <= roundings * (E4M3_REL * want.abs() + 2.0**-9 * descale)))


def test_one_descale_per_tensor_grows_with_a_louder_chunk_and_rescales_the_past():
    gen = torch.Generator().manual_seed(0)
    ck, cv = torch.zeros(12, 2, 8, dtype=E4M3), torch.zeros(12, 2, 8, dtype=E4M3)
    descale = torch.zeros(2)
    quiet = torch.randn(4, 2, 8, generator=gen)
    append_codes_reference((ck, cv), descale, (quiet, 3 * quiet), 0)
    assert descale.tolist() == pytest.approx([quiet.abs().max().item() / E4M3_MAX, 3 * quiet.abs().max().item() / E4M3_MAX])
    assert ck[:4].float().abs().max() == E4M3_MAX  # the loudest element on the largest code
    first = ck[:4].clone()
    softer = 0.1 * torch.randn(4, 2, 8, generator=gen)
    append_codes_reference((ck, cv), descale, (softer, softer), 4)
    assert torch.equal(ck[:4].view(torch.uint8), first.view(torch.uint8))  # no growth: the past untouched
    loud = 10 * torch.randn(4, 2, 8, generator=gen)
    append_codes_reference((ck, cv), descale, (loud, loud), 8)
    assert descale[0].item() == pytest.approx(loud.abs().max().item() / E4M3_MAX)
    assert descale[1].item() == pytest.approx(max(3 * quiet.abs().max(), loud.abs().max()).item() / E4M3_MAX)
    back = ck.float() * descale[0]
    want = torch.cat([quiet, softer, loud])
    assert _within_e4m3(back[8:], loud, descale[0].item())
    assert _within_e4m3(back[:8], want[:8], descale[0].item(), roundings=2)  # rounded again when rescaled
    assert not torch.equal(ck[:4].view(torch.uint8), first.view(torch.uint8))


def _visible_tokens(cache: SelfAttnKVCache, lo: int = 0) -> list[int]:
    """The absolute token each visible slot [lo, local_end) holds: a shifting window keeps the
    sink then the newest tokens in order, a ring (model/dit/kv_codes.py) puts token t at slot
    sink + (t - sink) mod (capacity - sink)."""
    sink, end, n = cache.sink_tokens, cache.global_end, cache.local_end
    if not cache.rolling or end <= cache.capacity:
        tokens = list(range(n)) if not cache.rolling else list(range(min(sink, n))) + list(range(end - (n - min(sink, n)), end))
    elif getattr(cache, "is_ring", False):
        ring = cache.capacity - sink
        newest = {sink + (t - sink) % ring: t for t in range(end - ring, end)}
        tokens = list(range(sink)) + [newest[j] for j in range(sink, cache.capacity)]
    else:
        tokens = list(range(sink)) + list(range(end - (n - sink), end))
    return tokens[lo:]


def _by_token(rows: torch.Tensor, tokens: list[int]) -> dict[int, torch.Tensor]:
    assert len(tokens) == rows.shape[0] == len(set(tokens))
    return dict(zip(tokens, rows))


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(4, 24), sink=st.integers(0, 6), n=st.integers(1, 6), chunks=st.integers(1, 7),
       rolling=st.booleans(), max_attention=st.one_of(st.none(), st.integers(1, 30)), coded_k=st.booleans())
def test_code_cache_follows_the_exact_cache(capacity, sink, n, chunks, rolling, max_attention, coded_k):
    """Any sequence of chunks (window, ring or growth, the denoising calls overwriting a chunk's
    slots): the exact cache's tokens, each within e4m3's rounding of its running descale; K given
    as codes with a fixed descale (the bound scales) is cached as it is."""
    assume(not rolling or sink + n <= capacity)
    kw = dict(rolling=rolling, sink_tokens=sink if rolling else 0, max_attention_size=max_attention)
    exact = SelfAttnKVCache(capacity, 2, 8, torch.float32, "cpu", **kw)
    exact_ring = SelfAttnKVCache(capacity, 2, 8, torch.float32, "cpu", ring=True, **kw)
    codes = Fp8CodesKVCache(capacity, 2, 8, torch.float32, "cpu", ring=True, **kw)
    assert codes.is_ring == exact_ring.is_ring == (rolling and (max_attention is None or max_attention >= capacity))
    assert not exact.is_ring
    gen = torch.Generator().manual_seed(capacity * 1000 + n)
    k_descale = torch.tensor([8.0 / E4M3_MAX])  # |K| < 4 * 2 below
    for c in range(chunks):
        for _ in range(2):
            amp = float(torch.rand(1, generator=gen)) * 4
            k, v = amp * torch.randn(n, 2, 8, generator=gen).clamp(-2, 2), torch.randn(n, 2, 8, generator=gen)
            k_in = ((k / k_descale).to(E4M3), k_descale) if coded_k else k
            ke, ve = exact.update(k, v, c * n)
            kr, vr = exact_ring.update(k, v, c * n)
            (kc, dk), (vc, dv) = codes.update(k_in, v, c * n)
            assert (codes.global_end, codes.local_end, codes.capacity) == (exact.global_end, exact.local_end,
                                                                           exact.capacity)
            assert kc.shape == ke.shape and kc.dtype == E4M3 and dk.shape == dv.shape == (1,)
            lo = exact.local_end - ke.shape[0]
            tokens = _visible_tokens(codes, lo)
            want_k, want_v = _by_token(ke, _visible_tokens(exact, lo)), _by_token(ve, _visible_tokens(exact, lo))
            got_k, got_v = _by_token(kc, tokens), _by_token(vc, tokens)
            assert got_k.keys() == want_k.keys()
            ring_k, ring_v = _by_token(kr, _visible_tokens(exact_ring, lo)), _by_token(vr, _visible_tokens(exact_ring, lo))
            assert ring_k.keys() == want_k.keys()  # the exact ring: the same rows, bit for bit
            assert all(torch.equal(ring_k[t], want_k[t]) and torch.equal(ring_v[t], want_v[t]) for t in want_k)
            if coded_k:
                assert dk.item() == k_descale.item()
                for t in range(c * n, (c + 1) * n):  # the chunk's codes as they were given
                    if t in got_k:
                        assert torch.equal(got_k[t].view(torch.uint8), k_in[0][t - c * n].view(torch.uint8))
            for got, d, want in ((got_k, dk, want_k), (got_v, dv, want_v)):
                g, w = torch.stack([got[t] for t in want]), torch.stack(list(want.values()))
                # a row rescaled r times is rounded r + 1 times; bound it by the chunks seen
                assert _within_e4m3(g.float() * d, w, d.item(), roundings=2 * chunks + 1)
                assert d.item() >= w.abs().max().item() / E4M3_MAX * (1 - 1e-6)  # no element saturates
    codes.reset()
    assert codes.global_end == 0 and not codes.descale.any()


def test_a_ring_writes_only_the_evicted_tokens_slots_and_does_not_rewind():
    """Window of 10 with a sink of 2: after it fills, a chunk of 3 lands on the slots of the 3
    oldest tokens after the sink (wrapping around the end), every other slot's bytes stay."""
    cache = Fp8CodesKVCache(10, 1, 4, torch.float32, "cpu", rolling=True, sink_tokens=2, ring=True)
    gen = torch.Generator().manual_seed(1)
    d = torch.tensor([0.01])
    chunk = lambda: ((torch.randn(3, 1, 4, generator=gen) / d).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), d)
    v = lambda: torch.randn(3, 1, 4, generator=gen)
    for start in (0, 3, 6):  # tokens 0-8 in slots 0-8
        cache.update(chunk(), v(), start)
    before = cache.k.view(torch.uint8).clone()
    k = chunk()
    cache.update(k, v(), 9)  # tokens 9, 10, 11 evict 2, 3, 4 (the oldest after the sink): slots 9, 2, 3
    after = cache.k.view(torch.uint8)
    changed = (after != before).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert set(changed) <= {9, 2, 3} and torch.equal(after[[9, 2, 3]], k[0].view(torch.uint8))
    assert (cache.global_end, cache.local_end) == (12, 10)
    cache.update(chunk(), v(), 9)  # the chunk's next denoising call rewrites the same slots
    with pytest.raises(ValueError, match="does not rewind"):
        cache.update(chunk(), v(), 3)
    assert not Fp8CodesKVCache(10, 1, 4, torch.float32, "cpu", rolling=True, sink_tokens=2).is_ring
    with pytest.raises(ValueError, match="per-token scales"):
        SelfAttnKVCache(10, 1, 4, torch.float32, "cpu", rolling=True, sink_tokens=2, fp8=True, ring=True)


def test_the_bound_scales_bound_the_norm_and_rope_region():
    """rope_norm_bound: no input of any loudness reaches past it (a row with all its energy on
    the channel of the largest weight comes close), so the fixed descale never saturates."""
    from model.accel.kernels import ROUNDING_MARGIN, qk_norm_rope, qk_norm_rope_codes, rope_norm_bound

    dim, heads = 64, 4
    gen = torch.Generator().manual_seed(2)
    weight = (torch.rand(dim, generator=gen) * 2 + 0.1).to(torch.bfloat16)
    angles = torch.rand(5, 1, dim // heads // 2, generator=gen) * 6.3
    cos, sin = angles.cos(), angles.sin()
    rows = torch.randn(1, 5, dim, generator=gen) * torch.tensor([1e-3, 1.0, 1e3, 1.0, 1.0])[None, :, None]
    spike = int(weight.float().abs().argmax())
    rows[0, 3] = 0.0
    rows[0, 3, spike] = 5.0  # all the energy on the largest weight's channel
    rows[0, 4, spike] = 1e4
    bound = rope_norm_bound(weight)
    out = qk_norm_rope(rows.to(torch.bfloat16), weight, cos, sin, 1e-6, heads).float()
    assert out.abs().max().item() <= bound
    assert out[0, 3].abs().max().item() >= 0.7 * bound / ROUNDING_MARGIN  # the bound is near tight there
    descale = torch.tensor([bound / E4M3_MAX])
    codes = qk_norm_rope_codes(rows.to(torch.bfloat16), weight, cos, sin, 1e-6, heads, descale)
    assert codes.dtype == E4M3 and (out / descale).abs().max().item() < E4M3_MAX  # nothing clamped
    assert _within_e4m3(codes.float() * descale, out, descale.item())


def test_allocation_and_admission_count_a_byte_per_element():
    cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2)
    caches = DiTCaches.allocate(cfg, 6, 3, torch.bfloat16, "cpu", kv=KVCacheConfig("fp8_codes"))
    assert all(isinstance(c, Fp8CodesKVCache) for c in caches.self_attn)
    plain = DiTCaches.allocate(cfg, 6, 3, torch.bfloat16, "cpu")
    assert caches.nbytes == DiTCaches.kv_bytes(cfg, 6, 3, torch.bfloat16, "fp8_codes")
    text = DiTCaches.kv_bytes(cfg, 6, 0, torch.bfloat16)
    assert caches.nbytes - text == (plain.nbytes - text) // 2 + 2 * 2 * 4  # + a descale per layer and tensor


def test_kv_codes_belongs_to_the_fp8_attention():
    with pytest.raises(ValueError, match="cudnn_fp8"):
        AccelOptions(fast=True, attention="cudnn").check_cache(KVCacheConfig("fp8_codes"))
    with pytest.raises(ValueError, match="fp8_codes"):
        AccelOptions(fast=True, attention="cudnn_fp8", qk_bound_scales=True).check_cache(KVCacheConfig())
    with pytest.raises(ValueError, match="cudnn_fp8"):
        AccelOptions(fast=True, qk_bound_scales=True)
    AccelOptions(fast=True, attention="cudnn_fp8", qk_bound_scales=True).check_cache(KVCacheConfig("fp8_codes"))


@pytest.fixture
def fp8_dit(fake_cudnn, monkeypatch):
    """A small fast DiT whose self-attention is the FP8 attention (a stand-in cuDNN on the CPU)."""
    from model.accel import transforms

    monkeypatch.setattr(transforms, "fp8_attention_available", lambda device: True)
    cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2)
    return init_dit_random(cfg, torch.float32, "cpu", 3, residual_scaled=True)


def _chunks(engine: DiTEngine, chunks: int) -> list[torch.Tensor]:
    import numpy as np

    from model.session import DiTSessionSpec

    gen = torch.Generator().manual_seed(7)
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=gen), height=32, width=48, seed=7,
                          total_latent_frames=3 * chunks)
    session = engine.open(spec)
    y = torch.randn(20, 3, 4, 6, generator=gen)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    intrinsics = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
    out = [engine.step(session, y, poses, intrinsics).latents for _ in range(chunks)]
    engine.close(session)
    return out


def test_the_fast_block_attends_through_the_code_cache(fp8_dit):
    exact = _chunks(DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True))), 3)
    per_call = _chunks(DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8"))), 3)
    codes_kv = KVCacheConfig("fp8_codes")
    engine = DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8")), kv=codes_kv)
    session_caches = engine.allocate_caches(_spec_for(engine))
    assert isinstance(session_caches.self_attn[0], Fp8CodesKVCache)
    codes = _chunks(engine, 3)
    bound = _chunks(DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8",
                                                                 qk_bound_scales=True)), kv=codes_kv), 3)
    assert all(b.self_attn.qk_descales is not None for b in fp8_dit.blocks)
    for e, p, c, b in zip(exact, per_call, codes, bound):
        err_codes, err_per_call, err_bound = (((x - e).norm() / e.norm()).item() for x in (c, p, b))
        assert 0 < err_codes < 2 * err_per_call, (err_codes, err_per_call)  # as close as the per-call codes
        assert 0 < err_bound < 2 * err_per_call, (err_bound, err_per_call)  # and with the bound scales
        assert not torch.equal(c, p)  # a different quantization of K and V, not the per-call path again
        assert not torch.equal(b, c)  # Q and K quantized by their bounds, not by their amax
    optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8"))
    assert all(b.self_attn.qk_descales is None for b in fp8_dit.blocks)  # off again


def _spec_for(engine: DiTEngine):
    from model.session import DiTSessionSpec

    return DiTSessionSpec(context=torch.zeros(8, engine.cfg.text_dim), height=32, width=48, seed=0,
                          total_latent_frames=3)
