"""FP8 GEMMs, round 2: the bias in the GEMM's epilogue and the inputs quantized by the kernels
that make them (CPU: this torch runs torch._scaled_mm with e4m3 operands)."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.accel import AccelOptions, optimize_dit
from model.accel import transforms
from model.accel.fast_block import FastDiTBlock
from model.accel.kernels import BlockKernels, gelu_quantize, quantize_rows
from model.accel.projection import Fp8Projection, Projection
from model.config import PRESETS
from model.dit.block import DiTBlock
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.session import DiTSessionSpec

FP8 = AccelOptions(fast=True, attention="cudnn", fp8=True)


def test_this_torch_runs_fp8_gemms_on_the_cpu():
    assert transforms.fp8_supported("cpu")  # the tests below need it; CI uses the same torch


def _projection(seed: int = 2) -> tuple[Fp8Projection, torch.Tensor]:
    torch.manual_seed(seed)
    lin = nn.Linear(128, 96).to(torch.bfloat16)
    nn.init.normal_(lin.bias, std=4.0)  # a bias large against x W^T: its rounding shows
    x = torch.randn(2, 50, 128, dtype=torch.bfloat16)
    return Fp8Projection.of(Projection.of(lin)), x


def test_fp8_projection_takes_rows_quantized_elsewhere():
    proj, x = _projection()
    assert torch.equal(proj(x), proj(quantize_rows(x)))  # same bits as its own quantization
    assert torch.equal(proj.gelu(x), proj.gelu(quantize_rows(x)))


def test_bias_in_the_epilogue_rounds_once():
    proj, x = _projection()
    xq, xs = quantize_rows(x.reshape(-1, 128))
    exact = (xq.double() * xs.double()) @ (proj.weight.double() * proj.scale.double().t()).t() + proj.bias.double()
    fused = proj(x).reshape(-1, 96)
    proj.bias_epilogue = False
    separate = proj(x).reshape(-1, 96)
    assert not torch.equal(fused, separate)  # the flag does change the path
    # one rounding of the float32 sum (at most half an ulp of bf16: 2^-8 relative) vs two (the
    # product, then the sum: the product's rounding error is not relative to the sum)
    rel = lambda y: ((y.double() - exact).abs() / exact.abs()).max().item()  # noqa: E731
    norm = lambda y: ((y.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert rel(fused) <= 2.0**-8 * 1.001 < rel(separate)
    assert norm(fused) < norm(separate)


def test_gelu_quantize_is_the_two_steps():
    y = torch.randn(3, 40, 64, dtype=torch.bfloat16) * 3
    q, s = gelu_quantize(y)
    q2, s2 = quantize_rows(F.gelu(y, approximate="tanh"))
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    assert s.shape == (3, 40, 1)


def _session_latents(dit: torch.nn.Module) -> torch.Tensor:
    cfg = PRESETS["tiny"].dit
    spec = DiTSessionSpec(context=torch.randn(5, cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                          height=64, width=64, total_latent_frames=6)
    engine = DiTEngine(dit)
    session = engine.open(spec)
    poses = np.tile(np.eye(4), (12, 1, 1))
    poses[:, 2, 3] = np.linspace(0, 1, 12)
    intrinsics = np.array([[50, 50, 32, 32.0]])
    noise = torch.Generator().manual_seed(0)
    return torch.cat([engine.step(session, torch.randn(20, 3, 8, 8, generator=noise), poses[6 * k:6 * k + 6],
                                  intrinsics).latents for k in range(2)], dim=1)


def test_inputs_quantized_in_their_kernels_are_the_same_function():
    """Eager: the fused regions quantize the very tensors the GEMMs would have quantized, so the
    session's latents are bit-identical to the FP8 run that quantizes in the GEMMs."""
    plain = init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 4)
    fused = optimize_dit(copy.deepcopy(plain), replace(FP8, fp8_quant="fused"))
    block = fused.blocks[0]
    assert block.kernels.quantize_inputs and isinstance(block.ffn_up, Fp8Projection)
    a = block.kernels.modulated_norm(torch.randn(1, 8, 64, dtype=torch.bfloat16), torch.zeros(64),
                                     torch.zeros(64), 1e-6, torch.bfloat16)
    assert isinstance(a, tuple) and a[0].dtype == torch.float8_e4m3fn  # the region returns FP8 rows
    separate = optimize_dit(copy.deepcopy(plain), FP8)
    assert not separate.blocks[0].kernels.quantize_inputs
    # the projections quantize with the kernels they run with (set_kernels hands them over)
    assert all(p.quantize is separate.blocks[0].kernels.quantize_rows
               for p in separate.blocks[0].projections().values())
    out_fused, out_separate = _session_latents(fused), _session_latents(separate)
    assert bool(torch.isfinite(out_fused).all())
    assert torch.equal(out_fused, out_separate)
    # and the fused model can go back to quantizing in the GEMMs (optimize_dit again)
    optimize_dit(fused, FP8)
    assert torch.equal(_session_latents(fused), out_separate)


def test_fused_quantization_needs_fp8():
    for quant in ("fused", "triton"):
        with pytest.raises(ValueError, match="fp8_quant"):
            AccelOptions(fast=True, fp8_quant=quant)
    with pytest.raises(ValueError, match="fp8_quant must be one of"):
        AccelOptions(fast=True, fp8=True, fp8_quant="tensor")
    with pytest.raises(ValueError, match="fp8_fast_accum"):
        AccelOptions(fast=True, fp8_fast_accum=True)
    with pytest.raises(ValueError, match="fp8_camera"):
        AccelOptions(fast=True, fp8_camera=True)
    kernels = BlockKernels.build("default", compile=False)
    assert not kernels.quantize_inputs


def test_fast_accumulation_reaches_every_fp8_gemm_and_back():
    dit = init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 4)
    optimize_dit(dit, replace(FP8, fp8_fast_accum=True))
    projections = [p for b in dit.blocks for p in b.projections().values()]
    assert projections and all(isinstance(p, Fp8Projection) and p.fast_accum for p in projections)
    optimize_dit(dit, FP8)
    assert not any(p.fast_accum for p in projections)


def test_no_fp8_device_leaves_the_blocks_untouched(monkeypatch):
    """A refused FP8 request must not leave blocks whose kernels hand FP8 rows to bf16 GEMMs."""
    monkeypatch.setattr(transforms, "fp8_supported", lambda device: False)
    dit = init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 4)
    with pytest.raises(ValueError, match="FP8"):
        optimize_dit(dit, replace(FP8, fp8_quant="fused"))
    assert all(type(b) is DiTBlock for b in dit.blocks)
    assert not any(isinstance(b, FastDiTBlock) for b in dit.blocks)


def test_camera_gemms_in_fp8_are_opt_in_and_close():
    plain = init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 4)
    fast = optimize_dit(copy.deepcopy(plain), AccelOptions(fast=True))
    without = optimize_dit(copy.deepcopy(plain), FP8)
    block = without.blocks[0]
    assert all(isinstance(p, Projection) for p in block.camera_projections().values())
    assert block.cam_injector_layer1.weight.device.type == "cpu"
    # the fast block's camera GEMMs as Projections compute what the Linears did
    p = torch.randn(1, 16, PRESETS["tiny"].dit.dim, dtype=torch.bfloat16)
    ref = plain.blocks[0].camera_modulation(p)
    got = fast.blocks[0].camera_modulation(p)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    # opt-in: FP8 camera GEMMs on a model already in FP8, their bf16 weights released
    optimize_dit(without, replace(FP8, fp8_camera=True, fp8_fast_accum=True))
    assert all(isinstance(p, Fp8Projection) and p.fast_accum for p in block.camera_projections().values())
    assert block.cam_scale_layer.weight.device.type == "meta"
    with_camera = optimize_dit(copy.deepcopy(plain), replace(FP8, fp8_camera=True))
    out_fast, out_fp8, out_cam = (_session_latents(d) for d in (fast, optimize_dit(copy.deepcopy(plain), FP8),
                                                                  with_camera))
    err_fp8 = ((out_fp8.double() - out_fast.double()).norm() / out_fast.double().norm()).item()
    err_cam = ((out_cam.double() - out_fast.double()).norm() / out_fast.double().norm()).item()
    assert 0 < err_fp8 < 0.1 and 0 < err_cam < 0.1 and not torch.equal(out_cam, out_fp8)


def test_a_gpu_replicas_fp8_options_compute_the_plain_fp8_function():
    """The serving FP8 options (fast accumulation, inputs quantized before the GEMMs: by the
    Triton kernels on a GPU, whose function tests/model/test_triton_quant.py checks against the
    compiled regions') applied on the CPU, eager, with the regions' quantization: the same
    latents as the FP8 GEMMs quantizing their own inputs."""
    serving = AccelOptions.for_serving("cuda", compile=True, fp8=True)
    assert serving.fp8_quant == "triton" and serving.fp8_fast_accum and not serving.fp8_camera
    serving = replace(serving, fp8_quant="fused", triton_rope=False)  # the Triton kernels need a GPU
    assert AccelOptions.for_serving("cuda", compile=False, fp8=True).fp8_quant == "gemm"
    assert AccelOptions.for_serving("cuda").fp8_quant == "gemm" and not AccelOptions.for_serving("cuda").fp8_fast_accum
    plain = init_dit_random(PRESETS["tiny"].dit, torch.bfloat16, "cpu", 4)
    eager = replace(serving, compile=False)
    served = _session_latents(optimize_dit(copy.deepcopy(plain), eager))
    baseline = _session_latents(optimize_dit(copy.deepcopy(plain), replace(eager, fp8_quant="gemm", fp8_fast_accum=False)))
    assert torch.equal(served, baseline)
