"""Sequence sharding of one chunk's tokens over the ranks of a sequence-parallel group.

The S tokens of a chunk are padded to a multiple of the world size N and cut into N equal
contiguous shards (spec B.9): rank r holds tokens [r * size, (r + 1) * size). Padded tokens
are zero rows; they run through the token-wise layers and are sliced off before anything
reads across tokens (the KV-cache write, attention, the output).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class SequenceShard:
    """Rank `rank`'s share of a chunk of `tokens` tokens over `world` ranks."""

    tokens: int
    world: int
    rank: int

    def __post_init__(self) -> None:
        assert self.tokens > 0 and self.world > 0 and 0 <= self.rank < self.world

    @property
    def size(self) -> int:
        """Tokens per rank, padding included: ceil(tokens / world)."""
        return -(-self.tokens // self.world)

    @property
    def padded(self) -> int:
        return self.size * self.world

    @property
    def start(self) -> int:
        return self.rank * self.size

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of x [B, tokens, ...] -> [B, size, ...] (zero rows past the end)."""
        assert x.shape[1] == self.tokens, (x.shape, self.tokens)
        part = x[:, self.start : self.start + self.size]
        missing = self.size - part.shape[1]
        if missing == 0:
            return part
        pad = [0, 0] * (x.ndim - 2) + [0, missing]  # F.pad lists the last dim first
        return F.pad(part, pad)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, ...] -> [padded, ...] with zero rows at the end."""
        assert x.shape[0] == self.tokens, (x.shape, self.tokens)
        return F.pad(x, [0, 0] * (x.ndim - 1) + [0, self.padded - self.tokens])
