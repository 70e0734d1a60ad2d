"""Typed options of the model-side speed transforms (applied from outside the model).

All off (the default) is the plain path: on the CPU in float32 it reproduces the reference's
recorded outputs bit for bit. `AccelOptions.for_serving` maps the serving flags (`compile`,
`fp8` of `deployments.config.ModelArgs`) to the options of a device.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Literal, get_args

import torch

from model.accel.fa3_attention import available as fa3_available
from model.dit.caches import KVCacheConfig

Attention = Literal["default", "cudnn", "flash", "cudnn_fp8", "fa4", "fa3", "fa3_fp8"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(Attention)
FP8_ATTENTIONS = ("cudnn_fp8", "fa3_fp8")  # the self-attentions in FP8: the code cache's readers
ServingAttention = Literal["cudnn", "fa4", "fa3", "auto"]  # a replica's `model.attention`
SERVING_ATTENTIONS: tuple[str, ...] = get_args(ServingAttention)
Fp8Quant = Literal["gemm", "fused", "triton"]
FP8_QUANT_MODES: tuple[str, ...] = get_args(Fp8Quant)


@dataclass(frozen=True, slots=True)
class AccelOptions:
    """What `optimize_dit` / `optimize_vae` / `enable_fp8` do.

    fast: the fast DiT block (fused q/k/v and camera scale/shift GEMMs, float32 RoPE, fused
      elementwise regions); same function as the plain block up to rounding.
    attention: SDPA backend preference of the fast block ("default" = PyTorch's choice);
      "cudnn_fp8": self-attention as cuDNN's fused FP8 SDPA (Q, K, V in e4m3 with one scale
      each, model/accel/fp8_attention.py; CUDA sm_90 with the cuDNN frontend; changes the
      numerics, opt-in), cross-attention as "cudnn". "fa4": both attentions through
      FlashAttention's CuTe DSL kernels (model/accel/fa4_attention.py; CUDA sm_90 with the
      flash-attn-4 wheel; exact bf16 attention, a benchmark option until measured). "fa3": both
      through FlashAttention-3's forward kernels (model/accel/fa3_attention.py; sm_90 with the
      fa3-fwd wheel; exact bf16 attention); "fa3_fp8": the self-attention through FA3 in FP8
      (e4m3 Q, K, V with per-tensor descales, O in bf16; opt-in like "cudnn_fp8", whose code
      cache and bound scales it reads), the cross-attention as "fa3".
    qk_bound_scales: with an FP8 attention ("cudnn_fp8", "fa3_fp8") and its code cache
      (`KVCacheConfig(format="fp8_codes")`, model/dit/caches.py: the sessions' caches are
      configured there, not here), Q and K quantized with a fixed descale per layer, a bound of
      their values / 448 (RMSNorm then RoPE: |x| <= sqrt(dim) max|norm weight|), inside the
      compiled norm + RoPE region that makes them: no amax pass, no bf16 Q/K written and read
      back, and K's cached codes never rescaled; a value far below the bound keeps e4m3's
      relative precision (3 mantissa bits) down to 2^-6 of a code.
    compile: torch.compile the fast block's elementwise regions (needs `fast`).
    triton_rope: the self-attention's Q / K RMSNorm + RoPE as one Triton pass per row
      (model/accel/triton_rope.py; CUDA with Triton; needs `fast`): the row read once, written
      once (bf16, or the bound scales' codes), where the compiled region reads it twice.
    fp8: FP8 e4m3 GEMMs with per-row/per-column scales (needs `fast`; Hopper or a CPU torch
      with `_scaled_mm`); changes the numerics (reported by the benchmark), off by default.
    fp8_quant: where the FP8 GEMMs' inputs are quantized: "gemm" (a pass of its own before each
      GEMM), "fused" (inside the compiled region that makes the input: the norms, the FFN's
      GELU) or "triton" (the four regions that feed a GEMM as one-pass Triton kernels with their
      tuned launches, model/accel/triton_quant.py; CUDA; the serving choice: 8.45 against
      8.68 s for "fused"). Not "gemm" needs `fp8`.
    fp8_camera: the camera modulation's GEMMs (3 per block, once per chunk) in FP8 too; needs
      `fp8`. Measured: -1.6 % time but 5x the deviation (7e-2 from float32, against 1.4e-2):
      the camera scale multiplies the whole residual stream. Nothing turns it on.
    fp8_fast_accum: the FP8 GEMMs with Hopper's fast accumulation (`use_fast_accum`: partial
      sums not promoted to float32 along K); needs `fp8`.
    skip_final_update: skip the t = 0 cache-update call of a session's last planned chunk (its
      K/V are never read: the noise plan ends there).
    vae_channels_last: channels-last weights for the VAE convolutions (CUDA).
    vae_compile: one torch.compile'd kernel for each VAE RMSNorm + SiLU pair, static shapes (one
      compile per input shape; dynamic shapes gave wrong results, see model/vae/fast.py).
    vae_pad_in_conv: each causal-conv input written once: spatial zero padding inside the
      convolution, cached and new frames in one `cat` (no padded copy); same function.
    vae_fold_bias: the residual blocks' conv biases added inside the next kernel (the RMSNorm +
      SiLU, the residual add) instead of a pass of their own; needs vae_pad_in_conv.
    vae_write_once: the residual blocks' RMSNorm + SiLU kernels write straight into their conv's
      input buffer (cached frames ahead of the new ones): no `cat` copy; needs vae_fold_bias.
    vae_batch_frames: a chunk's frames through the encoder / decoder in one call instead of one
      call per latent frame (`WanVAE.batch_frames`): the same function, each conv's history
      copied once per chunk; larger activations while a call runs.
    vae_upsample_in_conv: the decoder's nearest 2x upsampling and the 3x3 conv after it as one
      conv at the low resolution with 4x the output channels and a pixel shuffle
      (model/vae/upsample.py); the same function up to the rounding of summed taps.
    vae_upsample_kernel: 3 (each phase a 3x3 kernel, 5 of its taps zero) or 2 (the 2x2 taps
      alone: 16 of 36 multiplies); needs vae_upsample_in_conv for 2.
    vae_triton_stem: the encoder's first conv (3 input channels) as one Triton kernel with its
      bias inside (model/vae/stem.py; CUDA with Triton): cuDNN runs it at ~25 TFLOP/s.
    vae_downsample_in_conv: the encoder's one-sided pad + 3x3 stride-2 conv as one 4x4 conv with
      padding 1 (model/vae/downsample.py): no padded copy; the same function.
    """

    fast: bool = False
    attention: Attention = "default"
    qk_bound_scales: bool = False
    compile: bool = False
    triton_rope: bool = False
    fp8: bool = False
    fp8_quant: Fp8Quant = "gemm"
    fp8_camera: bool = False
    fp8_fast_accum: bool = False
    skip_final_update: bool = False
    vae_channels_last: bool = False
    vae_compile: bool = False
    vae_pad_in_conv: bool = False
    vae_fold_bias: bool = False
    vae_write_once: bool = False
    vae_batch_frames: bool = False
    vae_upsample_in_conv: bool = False
    vae_upsample_kernel: int = 3
    vae_triton_stem: bool = False
    vae_downsample_in_conv: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}")
        if (self.compile or self.fp8 or self.triton_rope or self.attention != "default") and not self.fast:
            raise ValueError("compile, fp8, triton_rope and the attention backend apply to the fast block: "
                             "set fast=True")
        if self.qk_bound_scales and self.attention not in FP8_ATTENTIONS:
            raise ValueError("qk_bound_scales writes K into the FP8 attention's code cache: set attention='cudnn_fp8' "
                             "or 'fa3_fp8'")
        if self.fp8_quant not in FP8_QUANT_MODES:
            raise ValueError(f"fp8_quant must be one of {FP8_QUANT_MODES}, got {self.fp8_quant!r}")
        if (self.fp8_fast_accum or self.fp8_camera) and not self.fp8:
            raise ValueError("fp8_fast_accum and fp8_camera are settings of the FP8 GEMMs: set fp8=True")
        if self.fp8_quant != "gemm" and not self.fp8:
            raise ValueError(f"fp8_quant={self.fp8_quant!r} quantizes the FP8 GEMMs' inputs: set fp8=True")
        if self.vae_fold_bias and not self.vae_pad_in_conv:
            raise ValueError("vae_fold_bias needs vae_pad_in_conv")
        if self.vae_write_once and not self.vae_fold_bias:
            raise ValueError("vae_write_once needs vae_fold_bias")
        if self.vae_upsample_kernel not in (2, 3):
            raise ValueError(f"vae_upsample_kernel must be 2 or 3, got {self.vae_upsample_kernel}")
        if self.vae_upsample_kernel == 2 and not self.vae_upsample_in_conv:
            raise ValueError("vae_upsample_kernel=2 is a form of vae_upsample_in_conv: set it")

    def check_cache(self, kv: KVCacheConfig) -> None:
        """Whether sessions' caches of `kv` work with these options' blocks (called once, where an
        engine is built): the code cache is read by the FP8 attention alone, and the bound scales'
        K comes coded, for the code cache."""
        if kv.format == "fp8_codes" and self.attention not in FP8_ATTENTIONS:
            raise ValueError("the fp8_codes KV cache is the FP8 attention's: set attention='cudnn_fp8' or 'fa3_fp8'")
        if self.qk_bound_scales and kv.format != "fp8_codes":
            raise ValueError("qk_bound_scales writes K into the FP8 attention's code cache: use the fp8_codes KV cache")

    @property
    def any(self) -> bool:
        return (self.fast or self.skip_final_update or self.vae_channels_last or self.vae_compile
                or self.vae_pad_in_conv or self.vae_batch_frames
                or self.vae_upsample_in_conv or self.vae_triton_stem
                or self.vae_downsample_in_conv)

    @classmethod
    def for_serving(cls, device: str | torch.device, compile: bool = False, fp8: bool = False,
                    vae_compile: bool = False, fp8_attention: bool = False,
                    attention: ServingAttention = "cudnn") -> "AccelOptions":
        """The options a replica on `device` runs with: on CUDA the fast block with cuDNN
        attention (`attention="fa4"`: FlashAttention's CuTe DSL kernels, session 7: 81 frames
        10.83 -> 10.27 s, windowed bf16 chunk 1.75 -> 1.65-1.68 s; needs the flash-attn-4 wheel;
        "fa3": FlashAttention-3's kernels, with `fp8_attention` FA3's FP8 too, the fa3-fwd wheel;
        "auto": "fa3" where it can run, `fa3_available`, else "cudnn"),
        the Q / K norm + RoPE as one Triton pass where Triton is installed (session 7: windowed
        chunk -11 ms bf16, -19 ms FP8), channels-last VAE convolutions with their padding inside the conv (the same
        function in bf16; with `vae_compile` also the folded conv biases, round 2), plus the
        opt-in flags (`compile`: the DiT's regions, `vae_compile`: the VAE's norms, `fp8`: FP8
        GEMMs, on CUDA with fast accumulation and, compiled, their inputs quantized by the tuned
        Triton kernels where Triton is installed, else in the compiled regions: round 2's fastest
        FP8 variant; `fp8_attention`: the self-attention in FP8 through cuDNN, CUDA only, with
        its cache in its own codes (`KVCacheConfig.for_serving`), Q and K by their bound scales:
        session 7, 1.173 -> 1.164 s), a chunk's frames in one VAE call (session 4: decode -8 %, encode -6 %, +0.5 GiB while a
        call runs) and the decoder's upsampling inside its conv with 2x2 phase kernels (session
        5: decode 110 -> 98 ms), the encoder's first conv in Triton where Triton is installed
        and its downsamplings' pad inside their convs (session 8: encode 0.063 -> 0.059 s); on
        the CPU the plain path unless one of the flags is asked
        for."""
        if torch.device(device).type == "cuda":
            quant = ("triton" if find_spec("triton") is not None else "fused") if fp8 and compile else "gemm"
            if attention not in SERVING_ATTENTIONS:
                raise ValueError(f"a replica's attention is one of {SERVING_ATTENTIONS}, got {attention!r}")
            if attention == "auto":
                attention = "fa3" if fa3_available(device) else "cudnn"
            if fp8_attention:  # the self-attention's FP8 kernel: FA3's with fa3, else cuDNN's
                attention = "fa3_fp8" if attention == "fa3" else "cudnn_fp8"
            return cls(fast=True, attention=attention,
                       qk_bound_scales=fp8_attention, triton_rope=find_spec("triton") is not None,
                       compile=compile, fp8=fp8,
                       skip_final_update=True, fp8_quant=quant, fp8_fast_accum=fp8,
                       vae_channels_last=True, vae_compile=vae_compile, vae_pad_in_conv=True,
                       vae_fold_bias=vae_compile, vae_batch_frames=True, vae_upsample_in_conv=True,
                       vae_upsample_kernel=2,
                       vae_triton_stem=find_spec("triton") is not None, vae_downsample_in_conv=True)
        if fp8_attention or attention not in ("cudnn", "auto"):
            raise ValueError(f"fp8_attention and attention={attention!r} run GPU kernels: CUDA only")
        return cls(fast=compile or fp8, compile=compile, fp8=fp8, vae_compile=vae_compile)
