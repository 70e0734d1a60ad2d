"""One block of the causal DiT: self-attention with RoPE and KV cache, camera modulation,
cross-attention to the text, FFN (spec A.3 step 5, A.5, A.6).

Precision (spec A.7): the Linear layers run in the compute dtype (the weights' dtype); the
norms, the modulation and the residual stream run in float32. The first block receives the
patch tokens in the compute dtype; `x + y * gate` with a float32 gate makes the residual
float32 from there on, exactly as the reference's autocast type promotion does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import DiTConfig
from model.dit.kv_cache import CrossAttnCache, SelfAttnKVCache
from model.dit.rope import RopeTable


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without affine parameters, computed in float32, cast back to x's dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps).type_as(x)


def affine_layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """An affine LayerNorm computed in float32 (weights upcast), cast back to x's dtype."""
    w, b = norm.weight.float(), norm.bias.float()
    return F.layer_norm(x.float(), norm.normalized_shape, w, b, norm.eps).type_as(x)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked attention, scale 1/sqrt(head_dim): [1, S, H, D] x [1, n, H, D] -> [1, S, H*D]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2)
    )  # [1, H, S, D]
    return out.transpose(1, 2).flatten(2)  # [1, S, H*D]


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) over the full width in float32, cast back, times weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)

    def forward(
        self, a: torch.Tensor, rope: RopeTable, cache: SelfAttnKVCache, start: int
    ) -> torch.Tensor:
        """a [1, S, dim] in the compute dtype -> [1, S, dim]; writes the chunk into `cache`."""
        k_all, v_all = self.write_kv(a, rope, cache, start)  # [n, H, D] each
        q = rope.apply(self.norm_q(self.q(a)).view(1, a.shape[1], self.num_heads, self.head_dim)).type_as(v_all)
        return self.o(attend(q, k_all[None], v_all[None]))

    def write_kv(
        self, a: torch.Tensor, rope: RopeTable, cache: SelfAttnKVCache, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's K (normed, rotated) and V into `cache`; returns what attention reads."""
        heads = (a.shape[1], self.num_heads, self.head_dim)
        v = self.v(a).view(1, *heads)  # [1, S, H, D]
        k = rope.apply(self.norm_k(self.k(a)).view(1, *heads)).type_as(v)
        return cache.update(k[0], v[0], start)


class CrossAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, text: torch.Tensor, cache: CrossAttnCache) -> torch.Tensor:
        """x [1, S, dim], text [1, text_len, dim] (compute dtype) -> [1, S, dim].

        The text K/V are computed on the first call and read from `cache` afterwards.
        """
        q = self.norm_q(self.q(x)).view(1, x.shape[1], self.num_heads, self.head_dim)
        if not cache.is_init:
            kv_shape = (text.shape[1], self.num_heads, self.head_dim)
            cache.store(self.norm_k(self.k(text[0])).view(kv_shape), self.v(text[0]).view(kv_shape))
        return self.o(attend(q, cache.k[None], cache.v[None]))


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        dim = cfg.dim
        self.eps = cfg.eps
        self.modulation = nn.Parameter(torch.zeros(1, 6, dim))
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.eps)
        self.norm3 = nn.LayerNorm(dim, eps=cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.ffn = nn.Sequential(
            nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim)
        )
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def camera_modulation(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(1 + scale, shift) [1, S, dim] from the chunk's camera tokens p [1, S, dim]."""
        hs = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(p))) + p
        return 1.0 + self.cam_scale_layer(hs), self.cam_shift_layer(hs)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: RopeTable,
        cam_scale: torch.Tensor,
        cam_shift: torch.Tensor,
        text: torch.Tensor,
        kv: SelfAttnKVCache,
        cross: CrossAttnCache,
        start: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """x [1, S, dim] residual; e0 [1, 1, 6, dim] float32; cam_scale = 1 + scale."""
        mod = self.modulation.float() + e0  # [1, 1, 6, dim]
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = mod.unbind(2)
        x = x + self.self_attn(self.attn_input(x, scale_sa, shift_sa, dtype), rope, kv, start) * gate_sa
        x = cam_scale * x + cam_shift
        x = x + self.cross_attn(affine_layer_norm(self.norm3, x).to(dtype), text, cross)
        h = layer_norm(x, self.eps).float() * (1 + scale_ff) + shift_ff
        return x + self.ffn(h.to(dtype)) * gate_ff

    def attn_input(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
        """The self-attention's input: the modulated LayerNorm of the residual, in `dtype`."""
        return (layer_norm(x, self.eps).float() * (1 + scale) + shift).to(dtype)

    def write_kv(self, x: torch.Tensor, e0: torch.Tensor, rope: RopeTable, kv: SelfAttnKVCache,
                 start: int, dtype: torch.dtype) -> None:
        """Only the block's write of the chunk's K/V into `kv` (what `forward` writes): for the
        last block of a call whose output is discarded (the t = 0 cache update)."""
        shift_sa, scale_sa = (self.modulation.float() + e0)[:, :, :2].unbind(2)
        self.self_attn.write_kv(self.attn_input(x, scale_sa, shift_sa, dtype), rope, kv, start)
