"""model/accel/fa3_attention.py: `attention="fa3"` (bf16) and `"fa3_fp8"` (FP8 over the code
cache) wired into the fast block, checked on the CPU against a stand-in `fa3_fwd_interface`
(tests/support.py `install_fake_fa3`) that checks what FA3's forward takes (shapes, layouts,
dtypes, descales [B, H_kv] float32) and computes it in float32 from the descales it is given.
The real kernels need an sm_90 GPU: benchmarks/probes/attention.py's fa3 rows and
benchmarks/probes/fa3_check.py measure them there."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model.accel import AccelOptions, optimize_dit, transforms
from model.accel import options as options_module
from model.accel.fa3_attention import Fa3Fp8Attention, available, head_descales
from model.accel.fp8_attention import quantize_tensor
from model.accel.kernels import attend
from model.accel.projection import Fp8Projection
from model.config import DiTConfig
from model.dit.caches import KVCacheConfig
from model.dit.kv_codes import Fp8CodesKVCache
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.session import DiTSessionSpec
from support import install_fake_fa3


@pytest.fixture
def fake_fa3(monkeypatch):
    """The stand-in kernel (`optimize_dit` told it is available); its calls' records."""
    calls = install_fake_fa3(monkeypatch)
    monkeypatch.setattr(transforms, "fa3_available", lambda device: True)
    return calls


def _sdpa(q, k, v):
    """float32 reference: [1, S, H, D] x [1, n, H, D] -> [1, S, H*D]."""
    return F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2).flatten(2)


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_head_descales_are_fa3s_batch_by_kv_head_float32():
    got = head_descales((torch.tensor([2.0]), torch.tensor([0.5], dtype=torch.float64), torch.tensor([3.0])), 1, 4)
    assert [tuple(x.shape) for x in got] == [(1, 4)] * 3
    assert all(x.dtype == torch.float32 and x.is_contiguous() for x in got)
    assert [x.unique().tolist() for x in got] == [[2.0], [0.5], [3.0]]  # each tensor's own, in order


def test_fp8_call_takes_the_codes_as_they_are_with_their_descales_per_head(fake_fa3):
    gen = torch.Generator().manual_seed(1)
    s, n, h, d = 6, 10, 3, 16
    # three different scales: a descale wired to the wrong operand shows
    q, k, v = (torch.randn(1, length, h, d, generator=gen).mul(c) for length, c in ((s, 1), (n, 0.3), (n, 5)))
    coded = [quantize_tensor(x) for x in (q, k, v)]
    got = Fa3Fp8Attention()(*coded)  # Q, K, V as the code cache and the bound scales give them
    (call,) = fake_fa3
    assert call["q"] == (1, s, h, d) and call["k"] == (1, n, h, d) and call["dtype"] == torch.float8_e4m3fn
    for passed, (_, descale) in zip(call["descales"], coded):
        assert torch.equal(passed, descale.expand(1, h))  # the tensor's descale for every head
    assert got.shape == (1, s, h * d) and got.dtype == torch.bfloat16  # FA3's output for e4m3 inputs
    want = _sdpa(*(c.float() * dsc for c, dsc in coded))
    assert _rel(got, want) < 5e-3  # the dequantized codes' attention, rounded to bf16 once
    assert 1e-3 < _rel(got, _sdpa(q, k, v)) < 0.08  # e4m3 inputs: an FP8 result, not the exact one
    # bf16 operands are quantized per call, per tensor; the output in the asked dtype
    again = Fa3Fp8Attention()(q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.float32)
    assert again.dtype == torch.float32 and fake_fa3[-1]["dtype"] == torch.float8_e4m3fn
    assert all(x.shape == (1, h) for x in fake_fa3[-1]["descales"])
    assert 1e-3 < _rel(again, _sdpa(q, k, v)) < 0.08


def test_bf16_call_is_exact_attention_without_descales(fake_fa3):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, length, 4, 16, generator=gen).bfloat16() for length in (5, 9, 9))
    got = attend(q, k, v, "fa3")
    assert got.shape == (1, 5, 64) and got.dtype == torch.bfloat16
    assert fake_fa3[0]["dtype"] == torch.bfloat16 and fake_fa3[0]["descales"] == [None] * 3
    assert _rel(got, _sdpa(q, k, v)) < 5e-3
    attend(q, k, v, "fa3_fp8")  # fa3_fp8's cross-attention: bf16 FA3
    assert fake_fa3[1]["dtype"] == torch.bfloat16


def test_fa3_is_refused_where_it_cannot_run():
    assert not available("cpu") and not available("cuda" if not torch.cuda.is_available() else "cpu")
    dit = init_dit_random(DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=1), torch.float32, "cpu", 0)
    for attention in ("fa3", "fa3_fp8"):
        with pytest.raises(ValueError, match=attention):
            optimize_dit(dit, AccelOptions(fast=True, attention=attention))


def _chunks(engine: DiTEngine, chunks: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=gen), height=32, width=48, seed=7,
                          total_latent_frames=3 * chunks)
    session = engine.open(spec)
    y = torch.randn(20, 3, 4, 6, generator=gen)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    poses[:, 0, 3] = np.linspace(0, 0.5, 12)
    intrinsics = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
    out = [engine.step(session, y, poses, intrinsics).latents for _ in range(chunks)]
    engine.close(session)
    return torch.cat(out, dim=1)


@pytest.fixture
def dit():
    cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2)
    return init_dit_random(cfg, torch.float32, "cpu", 3, residual_scaled=True)


def test_the_fast_dit_attends_through_fa3_as_through_sdpa(fake_fa3, dit):
    want = _chunks(DiTEngine(optimize_dit(dit, AccelOptions(fast=True, attention="cudnn"))))
    assert not fake_fa3  # SDPA's path never reaches the stand-in
    got = _chunks(DiTEngine(optimize_dit(dit, AccelOptions(fast=True, attention="fa3"))))
    assert _rel(got, want) < 1e-5
    assert {c["dtype"] for c in fake_fa3} == {torch.float32}  # the model's dtype, no FP8
    text = [c for c in fake_fa3 if c["k"][1] == dit.cfg.text_len]  # the cross-attention's (padded) text
    assert text and len(text) < len(fake_fa3)  # both attentions go through FA3


@pytest.mark.parametrize("fp8_gemms", [False, True], ids=["bf16_gemms", "fp8_gemms"])
def test_the_fp8_self_attention_reads_the_code_cache_through_fa3(fake_fa3, fake_cudnn, monkeypatch, dit, fp8_gemms):
    """fa3_fp8 over the code cache with the bound scales (as served) against cuDNN's FP8 over the
    same caches: the same quantized operands, O in bf16 instead of e4m3 codes, so closer to the
    exact path; FA3's bf16 O goes into the FP8 output projection as any input."""
    monkeypatch.setattr(transforms, "fp8_attention_available", lambda device: True)
    exact = _chunks(DiTEngine(optimize_dit(dit, AccelOptions(fast=True, fp8=fp8_gemms))))
    codes_kv = KVCacheConfig("fp8_codes")
    served = dict(fast=True, qk_bound_scales=True, fp8=fp8_gemms)
    cudnn = _chunks(DiTEngine(optimize_dit(dit, AccelOptions(attention="cudnn_fp8", **served)), kv=codes_kv))
    assert not fake_fa3
    engine = DiTEngine(optimize_dit(dit, AccelOptions(attention="fa3_fp8", **served)), kv=codes_kv)
    outs: list = []
    for block in dit.blocks:
        out = block.self_attn.out
        assert isinstance(out, Fp8Projection) == fp8_gemms
        if fp8_gemms:  # what the output projection's quantization is given
            quantize = out.quantize
            out.quantize = lambda x, quantize=quantize: (outs.append(x), quantize(x))[1]
    got = _chunks(engine)
    self_calls = [c for c in fake_fa3 if c["dtype"] == torch.float8_e4m3fn]
    assert self_calls and len(self_calls) < len(fake_fa3)  # the cross-attention stays bf16 (model dtype)
    assert all(c["q"][2] == dit.cfg.num_heads and c["k"][1] >= c["q"][1] for c in self_calls)
    # Q's descale is the layer's bound scale; K's and V's are the code cache's running descales
    bounds = {block.self_attn.qk_descales[0].item() for block in dit.blocks}
    assert {c["descales"][0].unique().item() for c in self_calls} == bounds
    assert all(c["descales"][1].unique().numel() == c["descales"][2].unique().numel() == 1 for c in self_calls)
    caches = engine.allocate_caches(DiTSessionSpec(context=torch.zeros(8, dit.cfg.text_dim), height=32, width=48,
                                                   seed=0, total_latent_frames=3))
    assert isinstance(caches.self_attn[0], Fp8CodesKVCache)
    if fp8_gemms:
        assert outs and all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in outs)
    err_fa3, err_cudnn = _rel(got, exact), _rel(cudnn, exact)
    assert 0 < err_fa3 < err_cudnn, (err_fa3, err_cudnn)  # FP8 operands; no e4m3 O
    assert _rel(got, cudnn) < 2 * err_cudnn


def test_serving_picks_fa3_where_asked_or_auto_finds_it(monkeypatch):
    from deployments.config import ModelArgs

    monkeypatch.setattr(options_module, "fa3_available", lambda device: True)
    bf16 = AccelOptions.for_serving("cuda", compile=True, attention="fa3")
    assert bf16.attention == "fa3" and not bf16.qk_bound_scales
    fp8 = AccelOptions.for_serving("cuda", compile=True, fp8=True, fp8_attention=True, attention="fa3")
    assert fp8.attention == "fa3_fp8" and fp8.qk_bound_scales  # FA3 over the code cache, bound Q / K
    fp8.check_cache(KVCacheConfig.for_serving("cuda", fp8_attention=True))
    assert AccelOptions.for_serving("cuda", attention="auto").attention == "fa3"
    assert AccelOptions.for_serving("cuda", fp8_attention=True, attention="auto").attention == "fa3_fp8"
    monkeypatch.setattr(options_module, "fa3_available", lambda device: False)  # no wheel, or not sm_90
    assert AccelOptions.for_serving("cuda", attention="auto").attention == "cudnn"
    assert AccelOptions.for_serving("cuda", fp8_attention=True, attention="auto").attention == "cudnn_fp8"
    assert AccelOptions.for_serving("cuda", attention="fa3").attention == "fa3"  # asked: optimize_dit refuses
    assert AccelOptions.for_serving("cpu", attention="auto") == AccelOptions()  # the plain CPU path
    with pytest.raises(ValueError, match="CUDA only"):
        AccelOptions.for_serving("cpu", attention="fa3")
    with pytest.raises(ValueError, match="fa3_fp8"):
        AccelOptions(fast=True, attention="fa3").check_cache(KVCacheConfig("fp8_codes"))
    assert ModelArgs(attention="auto").attention == "auto"  # the tiny CPU default: auto is plain there
    with pytest.raises(ValueError, match="model.attention"):
        ModelArgs(attention="fa3")
    assert ModelArgs(preset="tiny", device="cuda", attention="fa3", fp8_attention=True).attention == "fa3"


def test_the_gpu_check_runs_its_four_variants_on_stand_ins(fake_fa3, fake_cudnn, monkeypatch):
    """benchmarks/probes/fa3_check.py (the device's check of this path) with a tiny DiT: its
    variants run the kernels they name, through a CUDA replica's options (less its Triton
    kernels), and its verdicts hold where the kernels compute the documented math."""
    from dataclasses import replace

    from benchmarks.probes import fa3_check

    monkeypatch.setattr(transforms, "fp8_attention_available", lambda device: True)

    def options_for(device, compile, fp8, attention):
        served = AccelOptions.for_serving("cuda", compile=compile, fp8=fp8, fp8_attention=fp8, attention=attention)
        return replace(served, triton_rope=False, vae_triton_stem=False)

    cfg = DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=2, local_attn_size=6, sink_size=3)
    out = fa3_check.model_check(torch.device("cpu"), cfg, chunks=4, size=(32, 48), options_for=options_for)
    assert out["ok"] == {"bf16": True, "fp8": True, "kernels": True}, out
    assert [v["kv"] for v in out["variants"].values()] == ["dtype", "dtype", "fp8_codes", "fp8_codes"]
    bf16, fp8 = out["fa3_vs_cudnn"]["bf16"]["rel"], out["fa3_vs_cudnn"]["fp8"]["rel"]
    assert 0 < bf16 < 1e-3 and 0 < fp8 < 1e-2 and bf16 < fp8  # other kernels, same math; FP8's O rounded differently
    assert len(out["fa3_vs_cudnn"]["fp8"]["per_chunk_rel"]) == 4
    assert fa3_check.kernel_check(torch.device("cpu"), s=8, n=24, h=4, d=16)["ok"]
