"""The FP8 attention's code cache (model/kv_codes.py, `AccelOptions.kv_codes`): the slots of the
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
from model.dit_loader import init_dit_random
from model.engines import DiTEngine
from model.kv_cache import DiTCaches, SelfAttnKVCache
from model.kv_codes import E4M3, E4M3_MAX, Fp8CodesKVCache, append_codes_reference

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


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(4, 24), sink=st.integers(0, 6), n=st.integers(1, 6), chunks=st.integers(1, 7),
       rolling=st.booleans(), max_attention=st.one_of(st.none(), st.integers(1, 30)))
def test_code_cache_follows_the_exact_cache(capacity, sink, n, chunks, rolling, max_attention):
    """Any sequence of chunks (window or growth, the denoising calls overwriting a chunk's
    slots): the exact cache's slots, each within e4m3's rounding of its running descale."""
    assume(not rolling or sink + n <= capacity)
    kw = dict(rolling=rolling, sink_tokens=sink if rolling else 0, max_attention_size=max_attention)
    exact = SelfAttnKVCache(capacity, 2, 8, torch.float32, "cpu", **kw)
    codes = Fp8CodesKVCache(capacity, 2, 8, torch.float32, "cpu", **kw)
    gen = torch.Generator().manual_seed(capacity * 1000 + n)
    for c in range(chunks):
        for _ in range(2):
            amp = float(torch.rand(1, generator=gen)) * 4
            k, v = amp * torch.randn(n, 2, 8, generator=gen), torch.randn(n, 2, 8, generator=gen)
            ke, ve = exact.update(k, v, c * n)
            (kc, dk), (vc, dv) = codes.update(k, v, c * n)
            assert (codes.global_end, codes.local_end, codes.capacity) == (exact.global_end, exact.local_end,
                                                                           exact.capacity)
            assert kc.shape == ke.shape and kc.dtype == E4M3 and dk.shape == dv.shape == (1,)
            for got, d, want in ((kc, dk, ke), (vc, dv, ve)):
                # a row rescaled r times is rounded r + 1 times; bound it by the chunks seen
                assert _within_e4m3(got.float() * d, want, d.item(), roundings=2 * chunks + 1)
                assert d.item() >= want.abs().max().item() / E4M3_MAX * (1 - 1e-6)  # no element saturates
    codes.reset()
    assert codes.global_end == 0 and not codes.descale.any()


def test_allocation_and_admission_count_a_byte_per_element():
    cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2)
    caches = DiTCaches.allocate(cfg, 6, 3, torch.bfloat16, "cpu", codes=True)
    assert all(isinstance(c, Fp8CodesKVCache) for c in caches.self_attn)
    plain = DiTCaches.allocate(cfg, 6, 3, torch.bfloat16, "cpu")
    assert caches.nbytes == DiTCaches.kv_bytes(cfg, 6, 3, torch.bfloat16, codes=True)
    text = DiTCaches.kv_bytes(cfg, 6, 0, torch.bfloat16)
    assert caches.nbytes - text == (plain.nbytes - text) // 2 + 2 * 2 * 4  # + a descale per layer and tensor


def test_kv_codes_belongs_to_the_fp8_attention():
    with pytest.raises(ValueError, match="cudnn_fp8"):
        AccelOptions(fast=True, attention="cudnn", kv_codes=True)


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
    engine = DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8", kv_codes=True)))
    assert engine.kv_codes
    session_caches = engine.allocate_caches(_spec_for(engine))
    assert isinstance(session_caches.self_attn[0], Fp8CodesKVCache)
    codes = _chunks(engine, 3)
    for e, p, c in zip(exact, per_call, codes):
        err_codes, err_per_call = (((x - e).norm() / e.norm()).item() for x in (c, p))
        assert 0 < err_codes < 2 * err_per_call, (err_codes, err_per_call)  # as close as the per-call codes
        assert not torch.equal(c, p)  # a different quantization of K and V, not the per-call path again
    assert not DiTEngine(optimize_dit(fp8_dit, AccelOptions(fast=True, attention="cudnn_fp8"))).kv_codes


def _spec_for(engine: DiTEngine):
    from model.session import DiTSessionSpec

    return DiTSessionSpec(context=torch.zeros(8, engine.cfg.text_dim), height=32, width=48, seed=0,
                          total_latent_frames=3)
