"""The FP8 KV cache (model/dit/kv_quant.py, `KVCacheConfig("fp8_scaled")`): same layout as the exact cache, half its
bytes, the running chunk exact, the past within e4m3's rounding, and admission counts it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from deployments.config import AppArgs
from model.config import PRESETS
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.dit.caches import DiTCaches, KVCacheConfig
from model.dit.kv_cache import SelfAttnKVCache
from model.dit.e4m3 import E4M3
from model.dit.kv_quant import quantize
from model.session import DiTSessionSpec

E4M3_REL = 2.0**-4  # half an ulp of a 3-bit mantissa, relative to the value


def test_quantize_rounds_each_row_to_e4m3_with_its_own_scale():
    x = torch.randn(64, 4, 32) * torch.logspace(-6, 6, 4).view(1, 4, 1)  # heads of very different range
    q, scale = quantize(x)
    assert q.dtype == E4M3 and scale.shape == (64, 4)
    back = q.float() * scale[..., None]
    amax = x.abs().amax(-1, keepdim=True)
    assert torch.all((back - x).abs() <= E4M3_REL * x.abs() + 2.0**-9 * amax)  # subnormals near 0
    assert torch.allclose(back.abs().amax(-1), amax.squeeze(-1), rtol=1e-6)  # the row's amax maps to 448: no clipping
    q0, s0 = quantize(torch.zeros(3, 1, 8))
    assert torch.equal(q0.float() * s0[..., None], torch.zeros(3, 1, 8))


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(4, 24), sink=st.integers(0, 6), n=st.integers(1, 6), chunks=st.integers(1, 7),
       rolling=st.booleans(), max_attention=st.one_of(st.none(), st.integers(1, 30)))
def test_fp8_cache_follows_the_exact_cache(capacity, sink, n, chunks, rolling, max_attention):
    """Any sequence of chunks (window or growth): the same positions as the exact cache, the
    chunk just written returned exactly, older tokens within e4m3's rounding."""
    assume(not rolling or sink + n <= capacity)
    kw = dict(rolling=rolling, sink_tokens=sink if rolling else 0, max_attention_size=max_attention)
    exact = SelfAttnKVCache(capacity, 2, 8, torch.float32, "cpu", **kw)
    fp8 = SelfAttnKVCache(capacity, 2, 8, torch.float32, "cpu", fp8=True, **kw)
    gen = torch.Generator().manual_seed(capacity * 1000 + n)
    for c in range(chunks):
        for _ in range(2):  # the denoising calls overwrite the chunk's slots
            k, v = torch.randn(n, 2, 8, generator=gen), torch.randn(n, 2, 8, generator=gen)
            ke, ve = exact.update(k, v, c * n)
            kq, vq = fp8.update(k, v, c * n)
            assert (fp8.global_end, fp8.local_end, fp8.capacity) == (exact.global_end, exact.local_end, exact.capacity)
            assert kq.shape == ke.shape and kq.dtype == torch.float32
            own = min(n, ke.shape[0])
            assert torch.equal(kq[ke.shape[0] - own:], ke[ke.shape[0] - own:])
            assert torch.equal(vq[ke.shape[0] - own:], ve[ke.shape[0] - own:])
            for got, want in ((kq, ke), (vq, ve)):
                amax = want.abs().amax(-1, keepdim=True)
                assert torch.all((got - want).abs() <= E4M3_REL * want.abs() + 2.0**-9 * amax)
    assert fp8.k.dtype == E4M3


def test_fp8_caches_take_about_half_the_bytes():
    cfg = PRESETS["tiny"].dit
    caches = DiTCaches.allocate(cfg, 28, 6, torch.bfloat16, "cpu", kv=KVCacheConfig("fp8_scaled"))
    assert caches.self_attn[0].k.dtype == E4M3 and caches.cross_attn[0].k.dtype == torch.bfloat16
    assert caches.nbytes == DiTCaches.kv_bytes(cfg, 28, 6, torch.bfloat16, "fp8_scaled")
    released = PRESETS["lingbot-world-fast"].dit  # 81 frames at 464x832
    ratio = DiTCaches.kv_bytes(released, 1508, 21, torch.bfloat16, "fp8_scaled") / DiTCaches.kv_bytes(
        released, 1508, 21, torch.bfloat16)
    assert 0.5 < ratio < 0.53, ratio


def _run(engine, chunks: int) -> tuple[list[torch.Tensor], DiTCaches]:
    gen = torch.Generator().manual_seed(3)
    spec = DiTSessionSpec(context=torch.randn(7, engine.cfg.text_dim, generator=gen), height=64, width=112,
                          seed=5, total_latent_frames=3 * chunks)
    session = engine.open(spec)
    out = []
    for k in range(chunks):
        poses = np.tile(np.eye(4, dtype=np.float32), (12 if k else 9, 1, 1))
        poses[:, 2, 3] = 0.05 * np.arange(len(poses)) + k
        y = torch.randn(20, 3, 8, 14, generator=gen)
        out.append(engine.step(session, y, poses, np.tile([[50.0, 50, 56, 32]], (len(poses), 1)).astype(np.float32)).latents)
    return out, session.caches


def test_a_session_with_the_fp8_cache_stays_close_to_the_exact_one():
    """The tiny DiT in float32 over 4 chunks: chunk 0 attends only to itself (exact, so equal);
    later chunks deviate by e4m3's rounding of the past, far less than bf16 weights do."""
    exact, _ = _run(load_dit_engine("tiny", None, "float32", "cpu"), 4)
    quant, caches = _run(load_dit_engine("tiny", None, "float32", "cpu", kv=KVCacheConfig("fp8_scaled")), 4)
    assert caches.self_attn[0].k.dtype == E4M3
    assert torch.equal(exact[0], quant[0])
    devs = [float((q - e).norm() / e.norm()) for q, e in zip(quant[1:], exact[1:])]
    assert all(0 < d < 1e-3 for d in devs), devs  # measured 1.7e-5; bf16 weights alone give 1e-3


def test_admission_counts_the_fp8_cache_and_its_read_back():
    cfg = PRESETS["lingbot-world-fast"].dit

    class Shape(DiTEngine):  # the accounting only: no weights needed
        dit = None  # no model

        def __init__(self, kv_format: str) -> None:
            self.cfg, self.kv = cfg, KVCacheConfig(kv_format)

        @property
        def dtype(self) -> torch.dtype:
            return torch.bfloat16

    exact, fp8 = Shape("dtype").footprint(464, 832, 21, 21), Shape("fp8_scaled").footprint(464, 832, 21, 21)
    readback = 2 * 21 * 1508 * cfg.dim * 2 + 2 * 3 * 1508 * cfg.dim * 4  # one layer's K/V in bf16 + quantisation
    assert fp8.working == exact.working + readback
    assert exact.held - fp8.held == DiTCaches.kv_bytes(cfg, 1508, 21, torch.bfloat16) - DiTCaches.kv_bytes(
        cfg, 1508, 21, torch.bfloat16, "fp8_scaled")
    assert fp8.total < 0.6 * exact.total + 4.3 * 2**30  # about twice the sessions per budget


def test_fp8_kv_is_a_single_device_option():
    AppArgs.model_validate({"model": {"kv_cache": "fp8"}})
    with pytest.raises(ValueError, match="kv_cache fp8"):
        AppArgs.model_validate({"model": {"kv_cache": "fp8"}, "dit_parallel": 2})


def test_capacity_benchmark_counts_as_session_table_admits():
    """benchmarks/capacity.py's admission count is SessionTable's rule for equal sessions."""
    from benchmarks.capacity import admitted_sessions
    from deployments.replicas.session_table import SessionTable

    for budget, held, working in ((65, 24, 4), (21, 17, 4), (40, 12, 5), (100, 7, 0), (3, 4, 1)):
        table = SessionTable(64, budget, 300.0, 5.0)
        n = 0
        try:
            while True:
                table.admit(f"s{n}", held, working)
                n += 1
        except Exception:  # noqa: BLE001 - Busy or TooLarge ends the count
            pass
        assert admitted_sessions(budget, held, working) == n, (budget, held, working)
