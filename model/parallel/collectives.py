"""The three collectives of Ulysses sequence parallelism (backend-agnostic: NCCL or gloo).

`seq_to_heads` and `heads_to_seq` are the all-to-alls around self-attention: sequence
shards with all heads <-> the whole (padded) sequence with H/N heads. Rank r owns heads
[r * H/N, (r + 1) * H/N), so the head order of the single-GPU model is kept.
`gather_tokens` collects the per-rank head outputs into the full sequence on every rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def seq_to_heads(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """[n, s, H, D] (this rank's s tokens, all heads; n stacked tensors, e.g. q, k, v)
    -> [n, N*s, H/N, D] (all ranks' tokens in rank order, this rank's heads)."""
    world = dist.get_world_size(group)
    n, s, heads, d = x.shape
    assert heads % world == 0, f"{heads} heads do not split over {world} ranks"
    send = x.view(n, s, world, heads // world, d).permute(2, 0, 1, 3, 4).contiguous()  # [N, n, s, H/N, D]
    recv = torch.empty_like(send)  # [N (source rank), n, s, H/N, D]
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(n, world * s, heads // world, d)


def heads_to_seq(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """[N*s, F] (all tokens, this rank's heads flattened) -> [s, N*F] (this rank's tokens,
    all heads in order)."""
    world = dist.get_world_size(group)
    tokens, f = x.shape
    assert tokens % world == 0, f"{tokens} tokens do not split over {world} ranks"
    s = tokens // world
    send = x.contiguous()  # [N (destination rank), s, F] when viewed
    recv = torch.empty_like(send)  # [N (source rank = head group), s, F]
    dist.all_to_all_single(recv, send, group=group)
    return recv.view(world, s, f).transpose(0, 1).reshape(s, world * f)


def gather_tokens(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """[B, s, F] per rank -> [B, N*s, F] on every rank (rank order)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)
