"""Explicit streaming state of the causal Wan 2.1 VAE (spec C.2, H "VAE caches").

Every temporal convolution of the VAE sees, besides the frames of the current call, the last
input frames of the earlier calls of the same stream. That history is one `VaeCache` value per
stream (one encoder stream or one decoder stream per session): `encode_chunk` / `decode_chunk`
take it and return the next one. The input cache is never modified, so a caller may keep or
discard either; two sessions never share one.

Inside one encoder/decoder call the blocks read and write through a `CacheStep`: it reads the
previous call's frames by slot key (the module path of the conv, e.g.
``decoder.upsamples.3.time_conv``) and collects the frames for the next call. There is no
index counter: each slot is named by the module that owns it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import Tensor

CACHE_T = 2  # input frames kept per causal 3x3x3 / 3x1x1 conv (its temporal receptive field - 1)
STREAMS = ("encoder", "decoder")


@dataclass(frozen=True, slots=True, eq=False)  # eq: identity (holds tensors)
class VaeCache:
    """The causal-conv history of one encoder or decoder stream.

    `frames[key]` holds the last input frames of the conv at module path `key`,
    [1, C, n<=2, h, w]. An empty cache is the start of a stream: the first encoder call then
    takes frame 0 alone and the first decoder call skips the temporal upsampling (the
    reference's 'Rep' marker).
    """

    frames: Mapping[str, Tensor] = field(default_factory=lambda: MappingProxyType({}))
    stream: str | None = None  # "encoder" / "decoder" once a call has been made
    size: tuple[int, int] | None = None  # spatial size (h, w) of the stream's input

    def __post_init__(self) -> None:
        assert self.stream is None or self.stream in STREAMS, self.stream

    @classmethod
    def empty(cls) -> "VaeCache":
        """The state of a fresh stream."""
        return cls()

    @property
    def is_empty(self) -> bool:
        return not self.frames

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached frames."""
        return sum(t.numel() * t.element_size() for t in self.frames.values())

    def clone(self) -> "VaeCache":
        """A copy whose frames are copies (same device): a forked stream's own history."""
        return VaeCache(MappingProxyType({k: t.clone() for k, t in self.frames.items()}), self.stream, self.size)

    def check(self, stream: str, size: tuple[int, int]) -> None:
        """ValueError when this cache belongs to another kind of stream or another size."""
        if self.is_empty:
            return
        if self.stream != stream:
            raise ValueError(
                f"this VaeCache belongs to a {self.stream} stream, not a {stream} stream; "
                "keep one cache per stream (VaeCache.empty() starts a new one)"
            )
        if self.size != size:
            raise ValueError(
                f"input size {size} differs from the stream's size {self.size}; "
                "start a new stream with VaeCache.empty()"
            )


class CacheStep:
    """One encoder/decoder call: reads the previous call's frames, records the next ones."""

    def __init__(self, past: Mapping[str, Tensor]) -> None:
        self.past = past
        self.new: dict[str, Tensor] = {}

    @property
    def first(self) -> bool:
        """True for the first call of a stream (no history yet)."""
        return not self.past

    def swap(self, key: str, x: Tensor, keep: int = CACHE_T) -> Tensor | None:
        """Frames recorded for slot `key` by the previous call (None on the stream's first).

        Records the last `keep` frames of (previous frames ++ x) for the next call. When x
        has fewer than `keep` frames, the previous frames fill up the history, exactly as the
        reference does when a call has a single frame.
        """
        assert key, "conv has no cache key (build it inside WanVAE)"
        assert key not in self.new, f"cache slot {key} written twice in one call"
        prev = self.past.get(key)
        n = x.shape[2]
        if n >= keep:
            kept = x[:, :, n - keep :].clone()
        elif prev is None:
            kept = x.clone()
        else:
            kept = torch.cat([prev[:, :, -(keep - n) :], x], 2)
        self.new[key] = kept
        return prev

    def finish(self, stream: str, size: tuple[int, int]) -> VaeCache:
        """The cache after this call; every slot of the previous call must have been written."""
        assert not self.past or self.new.keys() == self.past.keys(), "cache slots changed"
        return VaeCache(MappingProxyType(self.new), stream, size)
