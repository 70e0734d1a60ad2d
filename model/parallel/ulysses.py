"""Ulysses sequence parallelism for the CausalDiT, applied from outside the model.

`apply_ulysses(dit, group)` turns a built CausalDiT into one rank of an N-rank replica:

* every rank holds all weights (no tensor parallelism) and runs the token-wise work
  (patch tokens, modulation, camera modulation, cross-attention, FFN, head) on its
  1/N sequence shard only; these are exact on a shard because they act per token;
* self-attention is the one place tokens meet: q, k, v of the shard (normed and rotated;
  RoPE acts per token, so rotating the shard's rows before the exchange is the same
  arithmetic as rotating the whole sequence after it) go through one all-to-all to the
  whole sequence with H/N heads, padding is sliced off, the chunk is written into the
  rank's KV cache (H/N heads) and attended, and a second all-to-all brings the output back;
* the head output is gathered so every rank returns the whole velocity, and the sampler
  then runs identically (same seed, same bytes) on every rank without further messages.

It composes with the speed transforms of `model/accel`: apply it AFTER `optimize_dit` (and
`enable_fp8`); a fast block's attention keeps its fused q/k/v GEMM, its compiled norm+RoPE
region and its attention backend. Parameters and state-dict keys are unchanged (the
attention modules change class in place, as `optimize_dit` does).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from model.accel.fast_block import FastSelfAttention
from model.config import DiTConfig
from model.dit.model import CameraFeatures, CausalDiT
from model.dit.block import SelfAttention, attend
from model.dit.caches import DiTCaches
from model.dit.kv_cache import SelfAttnKVCache
from model.parallel.collectives import gather_tokens, heads_to_seq, seq_to_heads
from model.parallel.sequence import SequenceShard
from model.dit.rope import RopeTable


@dataclass(frozen=True, slots=True)
class ShardedRope:
    """What a block hands its self-attention under SP (the block passes `rope` through
    untouched): the rotary table of this rank's tokens and the shard geometry."""

    table: RopeTable  # [size, 1, head_dim/2]: the shard's rows, zero rows for padding
    shard: SequenceShard


class UlyssesSelfAttention(SelfAttention):
    """SelfAttention on a sequence shard, attending over the whole sequence with H/N heads."""

    group: ProcessGroup

    def project(self, a: torch.Tensor, rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """a [1, s, dim] -> q, k (normed, rotated), v: [1, s, H, D] each (the plain block's math)."""
        heads = (1, a.shape[1], self.num_heads, self.head_dim)
        v = self.v(a).view(heads)
        q = rope.apply(self.norm_q(self.q(a)).view(heads)).type_as(v)
        k = rope.apply(self.norm_k(self.k(a)).view(heads)).type_as(v)
        return q, k, v

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(q, k, v)

    def project_out(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(x)

    def forward(
        self, a: torch.Tensor, rope: ShardedRope, cache: SelfAttnKVCache, start: int
    ) -> torch.Tensor:
        """a [1, s, dim] (this rank's tokens) -> [1, s, dim]; writes H/N heads into `cache`."""
        shard = rope.shard
        q, k, v = self.project(a, rope.table)  # [1, s, H, D] each
        qkv = seq_to_heads(torch.cat([q, k, v]), self.group)  # [3, N*s, H/N, D]
        q, k, v = qkv[:, : shard.tokens].unbind(0)  # padding sliced off: [S, H/N, D] each
        k_all, v_all = cache.update(k, v, start)  # [n, H/N, D] each
        out = self.attend_heads(q[None], k_all[None], v_all[None])[0]  # [S, H/N*D]
        return self.project_out(heads_to_seq(shard.pad(out), self.group)[None])  # [1, s, dim]

    def write_kv(
        self, a: torch.Tensor, rope: ShardedRope, cache: SelfAttnKVCache, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Only `forward`'s cache write: K and V of the shard to the whole sequence, H/N heads."""
        _, k, v = self.project(a, rope.table)  # [1, s, H, D] each
        k, v = seq_to_heads(torch.cat([k, v]), self.group)[:, : rope.shard.tokens].unbind(0)  # [S, H/N, D]
        return cache.update(k, v, start)


class UlyssesFastSelfAttention(UlyssesSelfAttention, FastSelfAttention):
    """The fast block's attention (model/accel) on a sequence shard."""

    def project(self, a: torch.Tensor, rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kn = self.kernels
        q, k, v = self.qkv(a).chunk(3, dim=-1)  # [1, s, dim] each
        q = kn.qk_norm_rope(q, self.norm_q.weight, rope.cos, rope.sin, self.norm_q.eps, self.num_heads)
        k = kn.qk_norm_rope(k, self.norm_k.weight, rope.cos, rope.sin, self.norm_k.eps, self.num_heads)
        return q, k, v.unflatten(-1, (self.num_heads, self.head_dim))

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.kernels.attend_self(q, k, v)

    def project_out(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


class UlyssesDiT(nn.Module):
    """One rank of a sequence-parallel CausalDiT: the CausalDiT interface (`cfg`, `dtype`,
    `embed_text`, `camera_features`, `forward`) with per-rank caches of H/N heads."""

    def __init__(self, dit: CausalDiT, group: ProcessGroup) -> None:
        super().__init__()
        self.dit = dit
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    @property
    def cfg(self) -> DiTConfig:
        return self.dit.cfg

    @property
    def dtype(self) -> torch.dtype:
        return self.dit.dtype

    def shard(self, tokens: int) -> SequenceShard:
        return SequenceShard(tokens, self.world, self.rank)

    def embed_text(self, context: torch.Tensor) -> torch.Tensor:
        return self.dit.embed_text(context)

    def camera_features(self, plucker: torch.Tensor) -> CameraFeatures:
        """Plücker [1, 384, f, H, W] -> camera modulation of this rank's tokens only.

        The shard's patches are laid out as a one-row strip [1, 384, pt, ph, size * pw] so
        that the model's own camera path (patch regroup, MLP, per-block layers) computes
        exactly those tokens, in order.
        """
        pt, ph, pw = self.cfg.patch
        if plucker.ndim != 5 or any(n % p for n, p in zip(plucker.shape[2:], self.cfg.patch)):
            raise ValueError(f"plucker must be [1, C, f, H, W] with (f, H, W) multiples of the "
                             f"patch {self.cfg.patch}, got {tuple(plucker.shape)}")
        b, c, f, h, w = plucker.shape
        patches = plucker.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        patches = patches.reshape(b, -1, c, pt, ph, pw)  # [1, S, C, pt, ph, pw] in (f, h, w) order
        mine = self.shard(patches.shape[1]).take(patches)  # [1, size, C, pt, ph, pw]
        strip = mine.permute(0, 2, 3, 4, 1, 5).reshape(b, c, pt, ph, -1)  # [1, C, pt, ph, size*pw]
        return self.dit.camera_features(strip)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        text: torch.Tensor,
        cam: CameraFeatures,
        caches: DiTCaches,
        start: int,
    ) -> torch.Tensor:
        """As CausalDiT.forward; `cam` from `camera_features` (this rank's tokens) and `caches`
        from `model.parallel.caches.allocate_sp_caches`. Every rank returns the whole output."""
        dit = self.dit
        h, e, e0, rope, grid = self._enter(x, t, y, cam, caches, start)
        # 4. Blocks on the shard; self-attention communicates
        h = dit.run_blocks(h, e0, rope, cam, text, caches, start, len(dit.blocks))
        # 5. Head on the shard, then every rank gathers the whole sequence: [1, S, 64]
        out = gather_tokens(dit.head(h, e), self.group)[:, : rope.shard.tokens]
        # 6. Unpatchify
        return dit.unpatchify(out, grid)

    def write_kv(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        text: torch.Tensor,
        cam: CameraFeatures,
        caches: DiTCaches,
        start: int,
    ) -> None:
        """As CausalDiT.write_kv, on every rank (the last block's K/V exchange included)."""
        h, _, e0, rope, _ = self._enter(x, t, y, cam, caches, start)
        self.dit.run_blocks_kv(h, e0, rope, cam, text, caches, start)

    def _enter(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cam: CameraFeatures, caches: DiTCaches,
        start: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ShardedRope, tuple[int, int, int]]:
        """Checks, then this rank's block inputs: (shard tokens [1, size, dim], e, e0, rope, grid)."""
        cfg, dit = self.cfg, self.dit
        pt, ph, pw = cfg.patch
        if x.ndim != 4 or any(n % p for n, p in zip(x.shape[1:], cfg.patch)):
            raise ValueError(f"x must be [{cfg.out_dim}, f, H, W] in multiples of the patch {cfg.patch}, "
                             f"got {tuple(x.shape)}")
        grid = (x.shape[1] // pt, x.shape[2] // ph, x.shape[3] // pw)
        frame_seqlen = grid[1] * grid[2]
        shard = self.shard(math.prod(grid))
        if cam.tokens != shard.size:
            raise ValueError(f"camera features hold {cam.tokens} tokens, this rank's shard {shard.size}; "
                             "build them with UlyssesDiT.camera_features")
        local_heads = caches.self_attn[0].k.shape[1]
        if local_heads * self.world != cfg.num_heads:
            raise ValueError(f"caches hold {local_heads} heads per rank, expected "
                             f"{cfg.num_heads // self.world}; allocate them with allocate_sp_caches")
        if start < 0 or start % frame_seqlen:
            raise ValueError(f"start token {start} is not a multiple of frame_seqlen {frame_seqlen}")
        # 1. Patchify the whole chunk (cheap), keep this rank's tokens: [1, size, dim]
        u = dit.patch_embedding(torch.cat([x, y]).to(dit.dtype)[None])  # [1, dim, f', h', w']
        h = shard.take(u.flatten(2).transpose(1, 2))
        # 2. Time: one embedding broadcast over the tokens
        e, e0 = dit.time_embed(t)
        # 3. Rotary table of the chunk at its absolute frame offset, this rank's rows
        table = dit.rope.chunk_table(start // frame_seqlen, grid, x.device, dit.rope_dtype)
        rope = ShardedRope(RopeTable(shard.take(table.cos[None])[0], shard.take(table.sin[None])[0]), shard)
        return h, e, e0, rope, grid


def apply_ulysses(dit: CausalDiT, group: ProcessGroup) -> UlyssesDiT:
    """Make `dit` one rank of a sequence-parallel replica over `group`, in place (each block's
    self-attention becomes its Ulysses counterpart; weights and keys stay)."""
    world = dist.get_world_size(group)
    if dit.cfg.num_heads % world:
        raise ValueError(f"{dit.cfg.num_heads} heads do not split over {world} ranks; use a "
                         f"sequence-parallel size that divides the head count")
    for block in dit.blocks:
        attn = block.self_attn
        if isinstance(attn, UlyssesSelfAttention):
            raise ValueError("apply_ulysses was already applied to this model")
        attn.__class__ = UlyssesFastSelfAttention if isinstance(attn, FastSelfAttention) else UlyssesSelfAttention
        attn.group = group
    return UlyssesDiT(dit, group)
