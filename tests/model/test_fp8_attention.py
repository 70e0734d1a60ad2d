"""model/accel/fp8_attention.py: per-tensor e4m3 quantization, and the cuDNN FP8 SDPA graph's
wiring (layouts, scales, output) checked against a stand-in `cudnn` module that computes what
the FP8 SDPA is documented to compute (the real one needs an sm_90 GPU: `python -m benchmarks.window
--precisions fp8 --fp8-attention` measures it there)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.accel import AccelOptions, optimize_dit
from model.accel.fp8_attention import CudnnFp8Attention, available, quantize_tensor
from model.dit.caches import KVCacheConfig
from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX
from model.config import DiTConfig
from model.dit.loader import init_dit_random
from support import FakeCudnnGraph


def test_quantize_tensor_one_scale_for_the_tensor():
    x = torch.randn(3, 50, 4, 8, generator=torch.Generator().manual_seed(0)) * 7
    codes, descale = quantize_tensor(x)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape and descale.shape == (1,)
    assert descale.item() == pytest.approx(x.abs().max().item() / E4M3_MAX)
    assert codes.float().abs().max().item() == E4M3_MAX  # the largest element lands on 448
    back = codes.float() * descale
    normal = x.abs() > 2 ** -6 * descale  # e4m3's normal range: 3 mantissa bits
    assert ((back - x).abs()[normal] <= x.abs()[normal] * 2 ** -4 + 1e-12).all()
    zeros, floor = quantize_tensor(torch.zeros(4, 4))
    assert not zeros.float().any() and floor.item() == pytest.approx(AMAX_FLOOR / E4M3_MAX)


def test_the_graph_attends_like_sdpa_up_to_fp8_rounding(fake_cudnn):
    gen = torch.Generator().manual_seed(1)
    s, n, h, d = 6, 10, 3, 16
    # three different scales: a descale wired to the wrong operand shows
    q, k, v = (torch.randn(1, length, h, d, generator=gen).mul(c).bfloat16() for length, c in ((s, 1), (n, 0.3), (n, 5)))
    attention = CudnnFp8Attention()
    want = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2).flatten(2)
    got = attention(q, k, v)
    assert got.shape == (1, s, h * d) and got.dtype == torch.bfloat16
    err = (got.float() - want).norm() / want.norm()
    assert 1e-3 < err < 0.08, err  # e4m3 inputs and output (the stand-in rounds nothing itself)
    codes, scales = attention.codes(q, k, v)  # what an FP8 output projection takes
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (1, s, h * d) and scales.shape == (1, s, 1)
    assert torch.equal((codes.float() * scales).bfloat16(), got)
    assert codes.float().abs().max() <= E4M3_MAX and torch.equal(scales, scales[:, :1].expand(1, s, 1))
    # a head's output depends on that head only (the [1, S, H, D] rows are read per head)
    q2 = q.clone()
    q2[:, :, 1] = 0
    again = attention(q2, k, v)
    assert torch.equal(again.view(1, s, h, d)[:, :, 0].float().sign(), got.view(1, s, h, d)[:, :, 0].float().sign())


def test_a_heads_major_graph_reads_and_writes_heads_major(fake_cudnn):
    """The attention probe's layout variant: Q, K, V, O as [1, H, length, D] give the rows
    graph's output transposed (a wrong stride would mix heads or tokens)."""
    gen = torch.Generator().manual_seed(3)
    s, n, h, d = 5, 9, 3, 16
    attention = CudnnFp8Attention()
    (qc, dq), (kc, dk), (vc, dv) = (quantize_tensor(torch.randn(1, length, h, d, generator=gen)) for length in (s, n, n))
    want, _ = attention.codes((qc, dq), (kc, dk), (vc, dv))
    g, tensors, _ = attention._build(s, n, h, d, torch.device("cpu"), heads_major=True, all_plans=True)
    assert g.policy == "ALL"
    q, k, v = ((c.transpose(1, 2).contiguous(), scale) for c, scale in ((qc, dq), (kc, dk), (vc, dv)))
    o = torch.empty_like(q[0])
    g.execute(attention.variant_pack(tensors, q, k, v, o), None)
    assert torch.equal(o.transpose(1, 2).flatten(2).float(), want.float())


def test_graphs_are_built_once_per_key_length(fake_cudnn):
    attention = CudnnFp8Attention()
    q = torch.randn(1, 4, 2, 16).bfloat16()
    for n in (8, 8, 12, 8):
        kv = torch.randn(1, n, 2, 16).bfloat16()
        attention(q, kv, kv)
    assert FakeCudnnGraph.builds == 2


def test_cudnn_fp8_is_refused_where_it_cannot_run():
    assert not available("cpu")
    dit = init_dit_random(DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=1), torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="cudnn_fp8"):
        optimize_dit(dit, AccelOptions(fast=True, attention="cudnn_fp8"))


def test_serving_turns_it_on_only_where_asked_and_only_on_cuda():
    from deployments.config import ModelArgs

    assert AccelOptions.for_serving("cuda", compile=True, fp8=True).attention == "cudnn"
    served = AccelOptions.for_serving("cuda", compile=True, fp8=True, fp8_attention=True)
    assert served.attention == "cudnn_fp8"
    assert KVCacheConfig.for_serving("cuda", fp8_attention=True).format == "fp8_codes"  # its own codes (session 6)
    assert served.qk_bound_scales  # Q and K by their bound scales (session 7)
    assert AccelOptions.for_serving("cuda", fp8=True, fp8_attention=True, attention="fa4").attention == "cudnn_fp8"
    plain = AccelOptions.for_serving("cuda", compile=True, fp8=True)
    assert KVCacheConfig.for_serving("cuda").format == "dtype" and not plain.qk_bound_scales
    assert AccelOptions.for_serving("cuda", compile=True, attention="fa4").attention == "fa4"
    with pytest.raises(ValueError, match="CUDA only"):
        AccelOptions.for_serving("cpu", fp8_attention=True)
    with pytest.raises(ValueError, match="CUDA only"):
        AccelOptions.for_serving("cpu", attention="fa4")
    with pytest.raises(ValueError, match="attention is one of"):
        AccelOptions.for_serving("cuda", attention="flash")
    with pytest.raises(ValueError, match="model.attention"):
        ModelArgs(attention="fa4")  # the tiny CPU default
    assert ModelArgs(preset="tiny", device="cuda", attention="fa4").attention == "fa4"
    with pytest.raises(ValueError, match="fp8_attention"):
        ModelArgs(fp8_attention=True)  # the tiny CPU default
    assert ModelArgs(preset="tiny", device="cuda", fp8_attention=True).fp8_attention
