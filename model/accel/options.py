"""Typed options of the model-side speed transforms (applied from outside the model).

All off (the default) is the plain path: on the CPU in float32 it reproduces the reference's
recorded outputs bit for bit. `AccelOptions.for_serving` maps the serving flags (`compile`,
`fp8` of `deployments.config.ModelArgs`) to the options of a device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Attention = Literal["default", "cudnn", "flash"]
ATTENTION_BACKENDS: tuple[str, ...] = ("default", "cudnn", "flash")


@dataclass(frozen=True, slots=True)
class AccelOptions:
    """What `optimize_dit` / `optimize_vae` / `enable_fp8` do.

    fast: the fast DiT block (fused q/k/v and camera scale/shift GEMMs, float32 RoPE, fused
      elementwise regions); same function as the plain block up to rounding.
    attention: SDPA backend preference of the fast block ("default" = PyTorch's choice).
    compile: torch.compile the fast block's elementwise regions (needs `fast`).
    fp8: FP8 e4m3 GEMMs with per-row/per-column scales (needs `fast`; Hopper or a CPU torch
      with `_scaled_mm`); changes the numerics (reported by the benchmark), off by default.
    skip_final_update: skip the t = 0 cache-update call of a session's last planned chunk (its
      K/V are never read: the noise plan ends there).
    vae_channels_last: channels-last weights for the VAE convolutions (CUDA).
    vae_compile: one torch.compile'd kernel for each VAE RMSNorm + SiLU pair, static shapes (one
      compile per input shape; dynamic shapes gave wrong results, see accel/vae_fast.py).
    vae_pad_in_conv: each causal-conv input written once: spatial zero padding inside the
      convolution, cached and new frames in one `cat` (no padded copy); same function.
    vae_fold_bias: the residual blocks' conv biases added inside the next kernel (the RMSNorm +
      SiLU, the residual add) instead of a pass of their own; needs vae_pad_in_conv.
    vae_write_once: the residual blocks' RMSNorm + SiLU kernels write straight into their conv's
      input buffer (cached frames ahead of the new ones): no `cat` copy; needs vae_fold_bias.
    """

    fast: bool = False
    attention: Attention = "default"
    compile: bool = False
    fp8: bool = False
    skip_final_update: bool = False
    vae_channels_last: bool = False
    vae_compile: bool = False
    vae_pad_in_conv: bool = False
    vae_fold_bias: bool = False
    vae_write_once: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}")
        if (self.compile or self.fp8 or self.attention != "default") and not self.fast:
            raise ValueError("compile, fp8 and the attention backend apply to the fast block: set fast=True")
        if self.vae_fold_bias and not self.vae_pad_in_conv:
            raise ValueError("vae_fold_bias needs vae_pad_in_conv")
        if self.vae_write_once and not self.vae_fold_bias:
            raise ValueError("vae_write_once needs vae_fold_bias")

    @property
    def any(self) -> bool:
        return (self.fast or self.skip_final_update or self.vae_channels_last or self.vae_compile
                or self.vae_pad_in_conv)

    @classmethod
    def for_serving(cls, device: str | torch.device, compile: bool = False, fp8: bool = False,
                    vae_compile: bool = False) -> "AccelOptions":
        """The options a replica on `device` runs with: on CUDA the fast block with cuDNN
        attention, channels-last VAE convolutions with their padding inside the conv (the same
        function in bf16; with `vae_compile` also the folded conv biases, round 2), plus the
        opt-in flags (`compile`: the DiT's regions, `vae_compile`: the VAE's norms, `fp8`); on
        the CPU the plain path unless one of the flags is asked for."""
        if torch.device(device).type == "cuda":
            return cls(fast=True, attention="cudnn", compile=compile, fp8=fp8, skip_final_update=True,
                       vae_channels_last=True, vae_compile=vae_compile, vae_pad_in_conv=True,
                       vae_fold_bias=vae_compile)
        return cls(fast=compile or fp8, compile=compile, fp8=fp8, vae_compile=vae_compile)
