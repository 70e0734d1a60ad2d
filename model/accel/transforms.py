"""Speed transforms applied from outside to built models (the model files never mention them).

    dit = init_dit_random(cfg, torch.bfloat16, "cuda", seed)      # or load_dit(...)
    optimize_dit(dit, AccelOptions(fast=True, attention="cudnn", compile=False))
    enable_fp8(dit)                                                # opt-in, after optimize_dit
    optimize_vae(vae, AccelOptions(vae_channels_last=True))

Apply them after the model is on its device and in its dtype (the fused weights are
concatenations made there). `optimize_dit` may be called again to change the attention
backend or the compile setting; the fusion happens once.
"""
from __future__ import annotations

from importlib.util import find_spec

import torch
from torch import nn

from model.accel.fast_block import FastDiTBlock
from model.accel.fa3_attention import available as fa3_available
from model.accel.fa4_attention import available as fa4_available
from model.accel.fp8_attention import available as fp8_attention_available
from model.accel.kernels import BlockKernels
from model.accel.options import AccelOptions
from model.accel.projection import Fp8Projection, Projection
from model.vae.fast import (bias_norm_silu, bias_residual, compiled, compiled_norm_silu, fold_conv_bias,
                                  fuse_norm_silu, native_upsampling, norm_silu_cat, pad_in_conv, rms_norm_silu,
                                  write_once)
from model.vae.downsample import downsample_in_conv
from model.vae.upsample import upsample_in_conv
from model.dit.model import CausalDiT
from model.vae.model import WanVAE

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: e4m3 tensor cores


@torch.no_grad()
def optimize_dit(dit: CausalDiT, options: AccelOptions) -> CausalDiT:
    """Give `dit` the fast blocks (in place) per `options`; returns it. No-op unless fast."""
    if not options.fast:
        return dit
    device = next(dit.parameters()).device
    if options.fp8:  # before any block changes: quantizing kernels need the FP8 GEMMs
        _require_fp8(device)
    if options.attention == "cudnn_fp8" and not fp8_attention_available(device):
        raise ValueError(f"attention='cudnn_fp8' needs an sm_90 GPU and the cuDNN frontend "
                         f"(pip install nvidia-cudnn-frontend); {device} has not")
    if options.triton_rope and (device.type != "cuda" or find_spec("triton") is None):
        raise ValueError(f"triton_rope runs a Triton kernel: CUDA with triton installed; {device} has not")
    if options.attention == "fa4" and not fa4_available(device):
        raise ValueError(f"attention='fa4' needs an sm_90 GPU and FlashAttention's CuTe DSL kernels "
                         f"(pip install flash-attn-4); {device} has not")
    if options.attention in ("fa3", "fa3_fp8") and not fa3_available(device):
        raise ValueError(f"attention={options.attention!r} needs an sm_90 GPU and FlashAttention-3's forward "
                         f"kernels (pip install fa3-fwd==0.0.3, with a CUDA 13 torch); {device} has not")
    kernels = BlockKernels.build(options.attention, options.compile, quant=options.fp8_quant,
                                 triton_rope=options.triton_rope)
    dit.rope_dtype = torch.float32
    for block in dit.blocks:
        if isinstance(block, FastDiTBlock):
            block.set_kernels(kernels)
        else:
            FastDiTBlock.adopt(block, kernels)
        block.self_attn.use_bound_scales(options.qk_bound_scales)
    if options.fp8:
        enable_fp8(dit, camera=options.fp8_camera)
        for block in dit.blocks:
            for proj in block.fp8_projections():
                proj.fast_accum = options.fp8_fast_accum
    return dit


def fp8_supported(device: torch.device | str) -> bool:
    """Whether `torch._scaled_mm` with e4m3 operands and row/column scales runs on `device`."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY
    try:
        a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1, device=device),
                         scale_b=torch.ones(1, 16, device=device), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


@torch.no_grad()
def enable_fp8(dit: CausalDiT, camera: bool = False) -> CausalDiT:
    """Run the per-call GEMMs of every fast block in FP8 e4m3 (in place), with `camera` also
    the camera modulation's (once per chunk); returns `dit`.

    The bf16 copies of the quantized weights are released (their parameters move to the meta
    device): the model then serves inference only and its state dict no longer holds them.
    """
    _require_fp8(next(dit.parameters()).device)
    if not all(isinstance(b, FastDiTBlock) for b in dit.blocks):
        raise ValueError("enable_fp8 works on the fast blocks: apply optimize_dit(dit, AccelOptions(fast=True)) first")
    for block in dit.blocks:
        quantize = block.kernels.quantize_rows
        projections = block.projections() | (block.camera_projections() if camera else {})
        replaced = {name: proj for name, proj in projections.items() if isinstance(proj, Projection)}
        for name, proj in replaced.items():
            owner, attr = _owner(block, name)
            setattr(owner, attr, Fp8Projection.of(proj, quantize))
        released = [block.self_attn.q, block.self_attn.k, block.self_attn.v, block.self_attn.o,
                    block.cross_attn.q, block.cross_attn.o, block.ffn[0], block.ffn[2]]
        if camera:
            released += [block.cam_injector_layer1, block.cam_injector_layer2, block.cam_scale_layer,
                         block.cam_shift_layer]
        for lin in released:
            lin.weight = nn.Parameter(torch.empty_like(lin.weight, device="meta"), requires_grad=False)
    return dit


def _require_fp8(device: torch.device) -> None:
    if not fp8_supported(device):
        raise ValueError(
            f"FP8 GEMMs need torch._scaled_mm with e4m3 on {device} (a GPU of compute capability "
            f">= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}); run without fp8"
        )


def _owner(block: FastDiTBlock, name: str) -> tuple[object, str]:
    *path, attr = name.split(".")
    return (block.get_submodule(".".join(path)) if path else block), attr


@torch.no_grad()
def optimize_vae(vae: WanVAE, options: AccelOptions) -> WanVAE:
    """cuDNN autotuning and native-dtype upsampling on CUDA, channels-last conv weights, a
    compiled RMSNorm + SiLU, conv inputs written once, conv biases folded and a chunk's frames
    in one call when asked (in place)."""
    if options.vae_triton_stem and (vae.device.type != "cuda" or find_spec("triton") is None):
        raise ValueError(f"vae_triton_stem runs a Triton kernel: CUDA with triton installed; {vae.device} has not")
    if vae.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        native_upsampling(vae)
    if options.vae_compile:
        fuse_norm_silu(vae, compiled_norm_silu())
    elif options.vae_fold_bias:
        fuse_norm_silu(vae, rms_norm_silu)
    if options.vae_pad_in_conv:
        pad_in_conv(vae)
    if options.vae_fold_bias:
        if options.vae_compile:
            fold_conv_bias(vae, compiled(bias_norm_silu), compiled(bias_residual))
        else:
            fold_conv_bias(vae)
    if options.vae_write_once:
        write_once(vae, compiled(norm_silu_cat) if options.vae_compile else norm_silu_cat)
    if options.vae_batch_frames:
        vae.batch_frames = True
    if options.vae_downsample_in_conv:  # before the layout: the new convs' weights become channels-last too
        downsample_in_conv(vae)
    if options.vae_channels_last:
        for module in vae.modules():
            if isinstance(module, nn.Conv3d):
                module.weight.data = module.weight.data.to(memory_format=torch.channels_last_3d)
            elif isinstance(module, nn.Conv2d):
                module.weight.data = module.weight.data.to(memory_format=torch.channels_last)
    if options.vae_upsample_in_conv:  # after the layout: the phase weights keep the conv's
        upsample_in_conv(vae, options.vae_upsample_kernel)
    if options.vae_triton_stem:
        from model.vae.stem import triton_stem  # imports triton
        triton_stem(vae)
    return vae
