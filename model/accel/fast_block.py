"""The fast DiT block: the plain block's modules and weights, a faster forward.

`FastDiTBlock` (and its attention classes) are subclasses that `optimize_dit` gives to the
blocks of a built model in place: the parameters, their names and the block's function stay;
the forward runs fused GEMMs (`Projection`) and the elementwise regions of `BlockKernels`
(eager or compiled), with an SDPA backend preference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from model.accel.kernels import BlockKernels, batched, rope_norm_bound
from model.accel.projection import Fp8Projection, Projection
from model.dit.e4m3 import E4M3_MAX
from model.dit.block import CrossAttention, DiTBlock, SelfAttention
from model.dit.kv_cache import CrossAttnCache, SelfAttnKVCache
from model.dit.rope import RopeTable

AnyProjection = Projection | Fp8Projection


class FastSelfAttention(SelfAttention):
    qkv: AnyProjection  # q, k, v fused: [dim] -> [3 * dim]
    out: AnyProjection
    kernels: BlockKernels
    qk_descales: tuple[Tensor, Tensor] | None = None  # the bound scales of Q and K ([1] each), or None

    def adopt(self, kernels: BlockKernels) -> None:
        self.qkv = Projection.fuse([self.q, self.k, self.v])
        self.out = Projection.of(self.o)
        self.kernels = kernels

    def use_bound_scales(self, on: bool) -> None:
        """Q and K as e4m3 codes with fixed descales, bound / 448 (`rope_norm_bound` of their norm
        weights), made by their norm + RoPE region: for the FP8 attention over a code cache
        (`AccelOptions.qk_bound_scales`). Off: per-call amax scales."""
        device = self.norm_q.weight.device
        self.qk_descales = tuple(torch.tensor([rope_norm_bound(norm.weight) / E4M3_MAX], dtype=torch.float32,
                                              device=device) for norm in (self.norm_q, self.norm_k)) if on else None

    def forward(self, a: Tensor, rope: RopeTable, cache: SelfAttnKVCache, start: int) -> Tensor:
        kn = self.kernels
        qkv = self.qkv(a)  # [1, S, 3 * dim]
        k_all, v_all = self.write_kv(a, rope, cache, start, qkv)  # [n, H, D] each (or a code cache's codes)
        q = qkv[..., :qkv.shape[-1] // 3]  # [1, S, dim] view
        args = (self.norm_q.weight, rope.cos, rope.sin, self.norm_q.eps, self.num_heads)
        if self.qk_descales is None:
            q = kn.qk_norm_rope(q, *args)
        else:  # (codes, descale): the FP8 attention reads Q as it is
            q = kn.qk_norm_rope_codes(q, *args, self.qk_descales[0]), self.qk_descales[0]
        quantized = isinstance(self.out, Fp8Projection)
        return self.out(kn.attend_self(q, batched(k_all), batched(v_all), quantized=quantized, dtype=qkv.dtype))

    def write_kv(self, a: Tensor, rope: RopeTable, cache: SelfAttnKVCache, start: int,
                 qkv: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The chunk's K (normed, rotated; or its e4m3 codes with the bound scales, which the code
        cache copies) and V into `cache`; returns what attention reads. `qkv`: the fused
        projection of `a` when the caller has it."""
        kn = self.kernels
        _, k, v = (self.qkv(a) if qkv is None else qkv).chunk(3, dim=-1)  # [1, S, dim] views
        v = v.unflatten(-1, (self.num_heads, self.head_dim))  # [1, S, H, D]
        args = (self.norm_k.weight, rope.cos, rope.sin, self.norm_k.eps, self.num_heads)
        if self.qk_descales is None:
            k = kn.qk_norm_rope(k, *args)[0]
        else:
            k = kn.qk_norm_rope_codes(k, *args, self.qk_descales[1])[0], self.qk_descales[1]
        return cache.update(k, v[0], start)


class FastCrossAttention(CrossAttention):
    q_proj: AnyProjection
    out: AnyProjection
    kernels: BlockKernels

    def adopt(self, kernels: BlockKernels) -> None:
        self.q_proj = Projection.of(self.q)
        self.out = Projection.of(self.o)
        self.kernels = kernels

    def forward(self, x: Tensor, text: Tensor, cache: CrossAttnCache) -> Tensor:
        kn = self.kernels
        q = kn.rms_norm(self.q_proj(x), self.norm_q.weight, self.norm_q.eps)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))  # [1, S, H, D]
        if not cache.is_init:  # once per session: the plain path
            kv_shape = (text.shape[1], self.num_heads, self.head_dim)
            cache.store(self.norm_k(self.k(text[0])).view(kv_shape), self.v(text[0]).view(kv_shape))
        return self.out(kn.attend(q, cache.k[None], cache.v[None]))


class FastDiTBlock(DiTBlock):
    self_attn: FastSelfAttention
    cross_attn: FastCrossAttention
    ffn_up: AnyProjection
    ffn_down: AnyProjection
    cam_in: AnyProjection  # cam_injector_layer1
    cam_out: AnyProjection  # cam_injector_layer2
    cam_scale_shift: AnyProjection  # cam_scale_layer and cam_shift_layer fused: [dim] -> [2 * dim]
    kernels: BlockKernels

    def adopt(self, kernels: BlockKernels) -> None:
        self.__class__ = FastDiTBlock
        self.self_attn.__class__ = FastSelfAttention
        self.self_attn.adopt(kernels)
        self.cross_attn.__class__ = FastCrossAttention
        self.cross_attn.adopt(kernels)
        self.ffn_up, self.ffn_down = Projection.of(self.ffn[0]), Projection.of(self.ffn[2])
        self.cam_in, self.cam_out = Projection.of(self.cam_injector_layer1), Projection.of(self.cam_injector_layer2)
        self.cam_scale_shift = Projection.fuse([self.cam_scale_layer, self.cam_shift_layer])
        self.kernels = kernels

    def set_kernels(self, kernels: BlockKernels) -> None:
        self.kernels = self.self_attn.kernels = self.cross_attn.kernels = kernels
        for proj in self.fp8_projections():
            proj.quantize = kernels.quantize_rows

    def projections(self) -> dict[str, AnyProjection]:
        """The per-call GEMMs (what FP8 replaces); the camera and text GEMMs run once."""
        return {"self_attn.qkv": self.self_attn.qkv, "self_attn.out": self.self_attn.out,
                "cross_attn.q_proj": self.cross_attn.q_proj, "cross_attn.out": self.cross_attn.out,
                "ffn_up": self.ffn_up, "ffn_down": self.ffn_down}

    def camera_projections(self) -> dict[str, AnyProjection]:
        """The camera modulation's GEMMs (once per chunk; FP8 with `AccelOptions.fp8_camera`)."""
        return {"cam_in": self.cam_in, "cam_out": self.cam_out, "cam_scale_shift": self.cam_scale_shift}

    def fp8_projections(self) -> list[Fp8Projection]:
        """The GEMMs that run in FP8 now (per-call ones, and the camera's with fp8_camera)."""
        return [p for p in (self.projections() | self.camera_projections()).values() if isinstance(p, Fp8Projection)]

    def camera_modulation(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """(1 + scale, shift) as two views of one [1, S, 2 * dim] tensor (no extra copy)."""
        hs = self.cam_out(F.silu(self.cam_in(p))) + p
        scale, shift = self.cam_scale_shift(hs).chunk(2, dim=-1)  # [1, S, dim] each
        return scale.add_(1.0), shift

    def attn_input(self, x: Tensor, scale: Tensor, shift: Tensor, dtype: torch.dtype) -> Tensor:
        return self.kernels.modulated_norm(x, scale, shift, self.eps, dtype)

    def forward(
        self,
        x: Tensor,
        e0: Tensor,
        rope: RopeTable,
        cam_scale: Tensor,
        cam_shift: Tensor,
        text: Tensor,
        kv: SelfAttnKVCache,
        cross: CrossAttnCache,
        start: int,
        dtype: torch.dtype,
    ) -> Tensor:
        """As DiTBlock.forward: x [1, S, dim] residual; e0 [1, 1, 6, dim] float32."""
        kn = self.kernels
        mod = self.modulation.float() + e0  # [1, 1, 6, dim]
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = mod.unbind(2)
        y = self.self_attn(self.attn_input(x, scale_sa, shift_sa, dtype), rope, kv, start)
        x, c = kn.attn_camera_norm(x, y, gate_sa, cam_scale, cam_shift, self.norm3.weight,
                                   self.norm3.bias, self.norm3.eps, dtype)
        x, h = kn.cross_residual_norm(x, self.cross_attn(c, text, cross), scale_ff, shift_ff, self.eps, dtype)
        hidden = kn.gelu_quantize(self.ffn_up(h)) if kn.quantize_inputs else self.ffn_up.gelu(h)
        return kn.gated_residual(x, self.ffn_down(hidden), gate_ff)
