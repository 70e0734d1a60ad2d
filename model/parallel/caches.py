"""Per-rank DiT caches of a sequence-parallel replica.

Self-attention caches hold the rank's H/N heads of every token (the whole sequence, after
the all-to-all); their capacity, window and roll are those of the single-GPU caches, built
by `DiTCaches.allocate` from the config of one rank's heads. Cross-attention runs on the
rank's tokens with all heads, so its text K/V cache is whole on every rank.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from model.config import DiTConfig
from model.dit.caches import DiTCaches
from model.dit.kv_cache import CrossAttnCache


def shard_config(cfg: DiTConfig, world: int) -> DiTConfig:
    """The attention geometry of one rank: H/N heads of the same head_dim."""
    if world < 1 or cfg.num_heads % world:
        raise ValueError(f"{cfg.num_heads} heads do not split over {world} ranks; "
                         f"pick a sequence-parallel size that divides the head count")
    local = replace(cfg, dim=cfg.head_dim * (cfg.num_heads // world), num_heads=cfg.num_heads // world)
    assert local.head_dim == cfg.head_dim
    return local


def allocate_sp_caches(
    cfg: DiTConfig,
    world: int,
    frame_seqlen: int,
    total_latent_frames: int | None,
    dtype: torch.dtype,
    device: torch.device | str,
    max_attention_size: int | None = None,
) -> DiTCaches:
    """One rank's caches of a session (arguments as `DiTCaches.allocate`; the small text
    caches of H/N heads that it builds for the local config are dropped)."""
    local = DiTCaches.allocate(shard_config(cfg, world), frame_seqlen, total_latent_frames, dtype,
                               device, max_attention_size)
    cross = [CrossAttnCache(cfg.text_len, cfg.num_heads, cfg.head_dim, dtype, device)
             for _ in range(cfg.num_layers)]
    return DiTCaches(local.self_attn, cross)


def sp_cache_bytes(cfg: DiTConfig, world: int, frame_seqlen: int, kv_frames: int, dtype: torch.dtype) -> int:
    """Bytes of one rank's caches holding `kv_frames` latent frames (admission control)."""
    local = shard_config(cfg, world)
    self_attn = DiTCaches.kv_bytes(local, frame_seqlen, kv_frames, dtype) - DiTCaches.kv_bytes(
        local, frame_seqlen, 0, dtype)  # without the text part
    return self_attn + DiTCaches.kv_bytes(cfg, frame_seqlen, 0, dtype)  # + the whole text K/V
