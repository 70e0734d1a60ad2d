"""model/accel: the speed transforms keep the model's function (CPU, tiny configs)."""
from __future__ import annotations

import copy
from dataclasses import replace
from importlib.util import find_spec

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.accel import AccelOptions, enable_fp8, fp8_supported, optimize_dit, optimize_vae
from model.accel.fast_block import FastDiTBlock
from model.accel.kernels import quantize_rows
from model.dit.e4m3 import E4M3_MAX
from model.accel.projection import Fp8Projection, Projection
from model.vae.fast import fuse_norm_silu
from model.checkpoint import CheckpointLayout
from model.config import PRESETS, VAEConfig
from model.dit.loader import init_dit_random, load_dit
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.dit.rope import Rope3D
from model.session import DiTSessionSpec
from model.vae.model import init_vae_random
from model.vae.blocks import ResidualBlock
from model.vae.cache import VaeCache
from support import GOLDEN_FILES, load_golden, rel_err, replay_golden

FAST = AccelOptions(fast=True, attention="cudnn", skip_final_update=True)


def norm_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def fast_tiny_dit(tiny_ckpt):
    return optimize_dit(load_dit(CheckpointLayout.discover(tiny_ckpt), torch.float32, "cpu"), FAST)


@pytest.mark.parametrize("golden_file", GOLDEN_FILES, ids=lambda p: p.stem)
def test_fast_dit_matches_goldens_in_float32(fast_tiny_dit, golden_file):
    """Every DiT call of the reference's runs (windowed ones too), through the fast blocks."""
    dit, g = fast_tiny_dit, load_golden(golden_file.name)
    errors = []
    for call, out, caches in replay_golden(dit, g):
        errors.append(rel_err(out, call["out"]))
        assert [c.global_end for c in caches.self_attn] == call["kv_global_end_after"]
        assert [c.local_end for c in caches.self_attn] == call["kv_local_end_after"]
    assert all(isinstance(b, FastDiTBlock) for b in dit.blocks)
    assert max(errors) < 1e-4


def test_optimize_keeps_parameters_and_fuses_into_views():
    dit = init_dit_random(PRESETS["tiny"].dit, torch.float32, "cpu", 3)
    before = {k: v.clone() for k, v in dit.state_dict().items()}
    optimize_dit(dit, FAST)
    after = dit.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    attn = dit.blocks[0].self_attn
    fused = attn.qkv.weight  # [3 * dim, dim]
    assert attn.q.weight.data_ptr() == fused.data_ptr()
    assert attn.v.weight.data_ptr() == fused[2 * dit.cfg.dim:].data_ptr()
    assert dit.rope_dtype == torch.float32
    optimize_dit(dit, AccelOptions(fast=True, attention="flash"))  # re-application: new kernels only
    assert dit.blocks[0].self_attn.qkv.weight is fused
    assert dit.blocks[1].cross_attn.kernels.attention == "flash"


def test_fused_projection_equals_separate_linears():
    torch.manual_seed(0)
    linears = [nn.Linear(32, n) for n in (32, 32, 16)]
    x = torch.randn(2, 7, 32)
    separate = torch.cat([lin(x) for lin in linears], dim=-1)
    proj = Projection.fuse(linears)
    assert proj.out_features == 80
    assert norm_rel(proj(x), separate) < 1e-6
    assert torch.equal(torch.cat([lin(x) for lin in linears], dim=-1), separate)  # Linears still work
    with torch.no_grad():
        proj.weight[40, 3] = 7.0  # the Linears' parameters are views of the fused weight
    assert linears[1].weight[8, 3].item() == 7.0


def test_plain_default_path_is_untouched():
    dit = init_dit_random(PRESETS["tiny"].dit, torch.float32, "cpu", 3)
    assert optimize_dit(dit, AccelOptions()) is dit
    assert not any(isinstance(b, FastDiTBlock) for b in dit.blocks) and dit.rope_dtype == torch.float64


def test_rope_float32_table_is_the_rounded_float64_table():
    rope = Rope3D(64)
    t64 = rope.chunk_table(5, (3, 4, 6), "cpu")
    t32 = rope.chunk_table(5, (3, 4, 6), "cpu", torch.float32)
    assert t64.dtype == torch.float64 and t32.dtype == torch.float32
    assert torch.equal(t32.cos, t64.cos.float()) and torch.equal(t32.sin, t64.sin.float())
    assert rope.chunk_table(5, (3, 4, 6), "cpu", torch.float32) is t32


def test_quantize_rows_bounds_the_error():
    torch.manual_seed(1)
    x = torch.randn(6, 64) * torch.logspace(-3, 3, 6)[:, None]
    x[2] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (6, 1)
    back = q.float() * scale
    assert torch.equal(back[2], torch.zeros(64))
    # e4m3: 3 mantissa bits -> half an ulp is 1/16 of the value; subnormals step 2^-9 of the scale
    bound = x.abs() / 16 + scale * 2.0**-9
    assert bool(((back - x).abs() <= bound * 1.0001).all())
    assert float(q.float().abs().max()) <= E4M3_MAX


def test_fp8_projection_is_close_to_the_exact_product():
    if not fp8_supported("cpu"):
        dit = optimize_dit(init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 3), FAST)
        with pytest.raises(ValueError, match="FP8"):
            enable_fp8(dit)
        return
    torch.manual_seed(2)
    lin = nn.Linear(128, 96).to(torch.bfloat16)
    nn.init.normal_(lin.bias)
    x = torch.randn(3, 50, 128, dtype=torch.bfloat16)
    exact = F.linear(x.double(), lin.weight.double(), lin.bias.double())
    fp8 = Fp8Projection.of(Projection.of(lin))(x)
    bf16 = lin(x)
    assert fp8.shape == exact.shape and fp8.dtype == torch.bfloat16
    err_fp8, err_bf16 = norm_rel(fp8, exact), norm_rel(bf16, exact)
    assert err_bf16 < err_fp8 < 0.05  # it does quantize, and stays close


def test_enable_fp8_runs_the_fast_dit_close_to_bf16():
    cfg = PRESETS["tiny"].dit
    plain = init_dit_random(cfg, torch.bfloat16, "cpu", 4)
    with pytest.raises(ValueError, match="optimize_dit"):
        enable_fp8(copy.deepcopy(plain))
    if not fp8_supported("cpu"):
        pytest.skip("this torch has no CPU torch._scaled_mm for e4m3 (refusal covered above)")
    fast = optimize_dit(copy.deepcopy(plain), FAST)
    fp8 = enable_fp8(optimize_dit(copy.deepcopy(plain), FAST))
    assert fp8.blocks[0].self_attn.q.weight.device.type == "meta"  # bf16 copy released
    assert isinstance(fp8.blocks[0].ffn_down, Fp8Projection)
    spec = DiTSessionSpec(context=torch.randn(5, cfg.text_dim), height=64, width=64, total_latent_frames=6)
    outs = []
    for dit in (fast, fp8):
        engine = DiTEngine(dit)
        session = engine.open(spec)
        poses = np.tile(np.eye(4), (12, 1, 1))
        poses[:, 2, 3] = np.linspace(0, 1, 12)
        y = torch.randn(20, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        outs.append(torch.cat([engine.step(session, y, poses[6 * k:6 * k + 6], np.array([[50, 50, 32, 32.0]])).latents
                               for k in range(2)], dim=1))
    assert bool(torch.isfinite(outs[1]).all())
    assert 0 < norm_rel(outs[1], outs[0]) < 0.1


def _two_chunk_run(options: AccelOptions):
    engine = load_dit_engine("tiny", None, "float32", "cpu", options=options)
    spec = DiTSessionSpec(context=torch.randn(4, engine.cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                          height=32, width=48, seed=7, total_latent_frames=6)
    session = engine.open(spec)
    session.trace = []
    poses = np.tile(np.eye(4), (12, 1, 1))
    poses[:, 0, 3] = np.linspace(0, 0.5, 12)
    latents = [engine.step(session, torch.zeros(20, 3, 4, 6), poses, np.array([[40, 40, 24, 16.0]])).latents
               for _ in range(2)]
    calls = sum(e["kind"] == "dit" for e in session.trace)
    return engine, torch.cat(latents, dim=1), calls


def test_skip_final_update_leaves_out_only_the_last_cache_write():
    plain_engine, plain, plain_calls = _two_chunk_run(AccelOptions())
    _, skipped, skipped_calls = _two_chunk_run(AccelOptions(skip_final_update=True))
    fast_engine, fast, _ = _two_chunk_run(FAST)
    assert (plain_calls, skipped_calls) == (10, 9)
    assert torch.equal(skipped, plain)
    assert isinstance(fast_engine.dit.blocks[0], FastDiTBlock) and fast_engine.skip_final_update
    assert not isinstance(plain_engine.dit.blocks[0], FastDiTBlock)
    assert norm_rel(fast, plain) < 1e-5


def test_options_are_checked():
    with pytest.raises(ValueError, match="fast=True"):
        AccelOptions(compile=True)
    with pytest.raises(ValueError, match="attention"):
        AccelOptions(fast=True, attention="sparse")
    with pytest.raises(ValueError, match="fast=True"):
        AccelOptions(triton_rope=True)


def test_the_triton_rope_is_refused_off_cuda():
    engine, _, _ = _two_chunk_run(FAST)
    with pytest.raises(ValueError, match="triton_rope.*CUDA"):
        optimize_dit(engine.dit, AccelOptions(fast=True, triton_rope=True))


def test_the_triton_stem_is_refused_off_cuda():
    """The encoder's Triton first conv needs a GPU (its math: tests/model/triton_quant_checks.py, in
    Triton's interpreter, also inside a streaming VAE); a GPU replica's options ask for it."""
    vae = init_vae_random(VAEConfig(dim=16), torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="vae_triton_stem.*CUDA"):
        optimize_vae(vae, AccelOptions(vae_triton_stem=True))
    assert AccelOptions(vae_triton_stem=True).any
    assert AccelOptions.for_serving("cuda").vae_triton_stem == (find_spec("triton") is not None)
    assert not AccelOptions.for_serving("cpu").vae_triton_stem


def test_serving_options_keep_the_function():
    """What a replica runs with: on the CPU the plain path (the goldens' numerics, bit for bit);
    a GPU replica's options, applied here on the CPU, give the same latents within the fast
    block's rounding and leave out the last planned cache update."""
    _, plain, plain_calls = _two_chunk_run(AccelOptions())
    _, cpu, cpu_calls = _two_chunk_run(AccelOptions.for_serving("cpu"))
    assert torch.equal(cpu, plain) and cpu_calls == plain_calls == 10
    served = AccelOptions.for_serving("cuda")
    assert served.triton_rope == (find_spec("triton") is not None)  # session 7: the Q / K norm + RoPE kernel
    gpu_engine, gpu, gpu_calls = _two_chunk_run(replace(served, triton_rope=False))  # the kernel needs a GPU
    assert isinstance(gpu_engine.dit.blocks[0], FastDiTBlock) and gpu_calls == 9
    assert norm_rel(gpu, plain) < 1e-5


def test_vae_transforms_keep_the_streams():
    vae = init_vae_random(VAEConfig(dim=16), torch.float32, "cpu", 0)
    fused = copy.deepcopy(vae)
    blocks = sum(isinstance(m, ResidualBlock) for m in vae.modules())
    assert fuse_norm_silu(fused) == 2 * blocks + 2  # two per residual block, one per head
    channels_last = optimize_vae(copy.deepcopy(vae), AccelOptions(vae_channels_last=True))
    assert channels_last.encoder.conv1.weight.is_contiguous(memory_format=torch.channels_last_3d)
    gen = torch.Generator().manual_seed(0)
    videos = [torch.rand(3, n, 16, 32, generator=gen) * 2 - 1 for n in (5, 8)]
    results = []
    for model in (vae, fused, channels_last):
        enc, dec, out = VaeCache.empty(), VaeCache.empty(), []
        for video in videos:
            z, enc = model.encode_chunk(video, enc)
            x, dec = model.decode_chunk(z, dec)
            out += [z, x]
        results.append(out)
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    assert max(norm_rel(b, a) for a, b in zip(results[0], results[2])) < 1e-5


@pytest.mark.parametrize("level", ["pad_in_conv", "fold_bias", "write_once", "batched", "fold_bias_batched",
                                   "upsample_in_conv", "upsample_2x2", "downsample_in_conv"])
def test_vae_written_once_transforms_keep_the_streams(level):
    """Round 2's VAE transforms (padding inside the conv, biases folded into the next kernel,
    norms writing into the conv's input buffer, a chunk's frames in one call) compute the plain
    streams, caches included."""
    flags = {"pad_in_conv": dict(vae_pad_in_conv=True),
             "fold_bias": dict(vae_pad_in_conv=True, vae_fold_bias=True),
             "write_once": dict(vae_pad_in_conv=True, vae_fold_bias=True, vae_write_once=True),
             "batched": dict(vae_batch_frames=True),
             "fold_bias_batched": dict(vae_pad_in_conv=True, vae_fold_bias=True, vae_batch_frames=True),
             "upsample_in_conv": dict(vae_pad_in_conv=True, vae_fold_bias=True, vae_batch_frames=True,
                                      vae_upsample_in_conv=True),
             "upsample_2x2": dict(vae_pad_in_conv=True, vae_fold_bias=True, vae_batch_frames=True,
                                  vae_upsample_in_conv=True, vae_upsample_kernel=2),
             "downsample_in_conv": dict(vae_pad_in_conv=True, vae_fold_bias=True, vae_batch_frames=True,
                                        vae_upsample_in_conv=True, vae_upsample_kernel=2,
                                        vae_downsample_in_conv=True)}[level]
    vae = init_vae_random(VAEConfig(dim=16), torch.float32, "cpu", 0)
    fast = optimize_vae(copy.deepcopy(vae), AccelOptions(vae_channels_last=True, **flags))
    gen = torch.Generator().manual_seed(1)
    videos = [torch.rand(3, n, 16, 32, generator=gen) * 2 - 1 for n in (5, 8, 4)]
    caches, results = [], []
    for model in (vae, fast):
        enc, dec, out = VaeCache.empty(), VaeCache.empty(), []
        for video in videos:
            z, enc = model.encode_chunk(video, enc)
            x, dec = model.decode_chunk(z, dec)
            out += [z, x]
        results.append(out)
        caches.append((enc, dec))
    assert max(norm_rel(b, a) for a, b in zip(*results)) < 1e-5
    for plain, other in zip(*caches):
        assert plain.frames.keys() == other.frames.keys()
        for key, frames in plain.frames.items():
            assert other.frames[key].shape == frames.shape, key
            assert norm_rel(other.frames[key], frames) < 1e-5, key


@pytest.mark.parametrize("size", [(16, 32), (15, 9)])
def test_the_downsampling_pad_inside_a_4x4_conv_is_the_same_function(size):
    """ZeroPad2d((0, 1, 0, 1)) + 3x3 stride-2 conv == the 4x4 stride-2 conv with padding 1 whose
    first row and column are zero (odd sizes too); the VAE's three downsamplings take it."""
    from model.vae.downsample import downsample_in_conv, padded_conv
    from model.vae.blocks import Downsample

    gen = torch.Generator().manual_seed(4)
    conv = torch.nn.Conv2d(5, 7, 3, stride=2)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        conv.bias.copy_(torch.randn(7, generator=gen))
    x = torch.randn(3, 5, *size, generator=gen, dtype=torch.float64)
    want = conv.double()(F.pad(x, (0, 1, 0, 1)))
    got = padded_conv(conv)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    vae = init_vae_random(VAEConfig(dim=16), torch.float32, "cpu", 0)
    assert downsample_in_conv(vae) == 3
    assert all(m.resample.kernel_size == (4, 4) for m in vae.modules() if isinstance(m, Downsample))


def test_vae_round2_options_are_checked():
    with pytest.raises(ValueError, match="vae_pad_in_conv"):
        AccelOptions(vae_fold_bias=True)
    with pytest.raises(ValueError, match="vae_fold_bias"):
        AccelOptions(vae_pad_in_conv=True, vae_write_once=True)
    with pytest.raises(ValueError, match="vae_upsample_in_conv"):
        AccelOptions(vae_upsample_kernel=2)
    with pytest.raises(ValueError, match="2 or 3"):
        AccelOptions(vae_upsample_in_conv=True, vae_upsample_kernel=4)
