"""3-D rotary position embedding with an absolute frame offset (spec A.4).

Each head's `head_dim` is split into complex pairs for the (time, height, width) axes:
`c - 2(c//3), c//3, c//3` pairs with `c = head_dim/2` (22, 21, 21 for head_dim 128). The time
position of a token is `start_frame + f` (absolute, so chunks continue where the previous
one stopped); height and width positions are patch-grid indices. The rotation is done in
float64 and the result is cast back to the input dtype, as in the reference.

The rotation table of one chunk depends only on (start_frame, grid); `Rope3D` memoises the
last few so that the 5 DiT calls of a chunk share one table. `RopeTable.dtype` is the math
dtype: float64 (the default) reproduces the reference; `chunk_table(..., dtype=float32)`
gives the GPU path's table (the angles are still computed in float64, then rounded).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from camera.frames import MAX_LATENT_FRAMES

MAX_FRAMES = MAX_LATENT_FRAMES  # frame positions covered by the reference's table (1024)
THETA = 10000.0
_CHUNK_TABLES_KEPT = 16


def axis_pairs(head_dim: int) -> tuple[int, int, int]:
    """Complex pairs of the (time, height, width) axes for one head."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def axis_angles(length: int, pairs: int) -> torch.Tensor:
    """Angles [length, pairs] float64: outer(positions, 1 / theta^(2k / (2 * pairs)))."""
    n = 2 * pairs
    inv = 1.0 / torch.pow(THETA, torch.arange(0, n, 2, dtype=torch.float64, device="cpu").div(n))
    return torch.outer(torch.arange(length, dtype=torch.float64, device="cpu"), inv)


@dataclass(frozen=True, slots=True)
class RopeTable:
    """cos/sin of one chunk's tokens, [S, 1, head_dim/2] (broadcast over heads)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.cos.dtype

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate consecutive pairs (x[2i], x[2i+1]) of x [..., S, heads, head_dim]."""
        pairs = x.to(self.dtype).unflatten(-1, (-1, 2))  # [..., S, heads, head_dim/2, 2]
        a, b = pairs[..., 0], pairs[..., 1]
        real = a * self.cos - b * self.sin
        imag = a * self.sin + b * self.cos
        return torch.stack((real, imag), dim=-1).flatten(-2).to(x.dtype)

    def to(self, dtype: torch.dtype) -> "RopeTable":
        return RopeTable(self.cos.to(dtype), self.sin.to(dtype))


class Rope3D:
    """The 3-D RoPE of one head size: base tables plus a small memo of chunk tables."""

    def __init__(self, head_dim: int, max_frames: int = MAX_FRAMES) -> None:
        self.head_dim = head_dim
        self.max_frames = max_frames
        angles = torch.cat([axis_angles(max_frames, n) for n in axis_pairs(head_dim)], dim=1)
        # polar() gives the reference's exact cos/sin values; [max_frames, head_dim/2]
        freqs = torch.polar(torch.ones_like(angles), angles)
        self._cos = freqs.real.contiguous()
        self._sin = freqs.imag.contiguous()
        self._reset_memo()

    def _reset_memo(self) -> None:
        self._base: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._chunks: OrderedDict[tuple, RopeTable] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Copies and pickles (deepcopy of the model, Ray) carry the base tables, not the memo."""
        return {"head_dim": self.head_dim, "max_frames": self.max_frames, "_cos": self._cos, "_sin": self._sin}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_memo()

    def chunk_table(
        self,
        start_frame: int,
        grid: tuple[int, int, int],
        device: torch.device | str,
        dtype: torch.dtype = torch.float64,
    ) -> RopeTable:
        """Table for a chunk whose tokens are the (f, h, w) raster of `grid`, at `start_frame`,
        with math dtype `dtype` (float64 = the reference)."""
        f, h, w = grid
        if start_frame < 0 or start_frame + f > self.max_frames:
            raise ValueError(
                f"latent frames {start_frame}..{start_frame + f - 1} exceed the RoPE table of "
                f"{self.max_frames} frames; end the session and open a new one"
            )
        if h > self.max_frames or w > self.max_frames:
            raise ValueError(f"patch grid {h}x{w} exceeds the RoPE table of {self.max_frames}")
        device = torch.device(device)
        key = (start_frame, f, h, w, device, dtype)
        with self._lock:
            table = self._chunks.get(key)
            if table is not None:
                self._chunks.move_to_end(key)
                return table
        table = self._build(start_frame, f, h, w, device)
        if dtype != table.dtype:
            table = table.to(dtype)
        with self._lock:
            self._chunks[key] = table
            while len(self._chunks) > _CHUNK_TABLES_KEPT:
                self._chunks.popitem(last=False)
        return table

    def _build(self, start: int, f: int, h: int, w: int, device: torch.device) -> RopeTable:
        cos, sin = self._device_base(device)
        nt, nh, nw = axis_pairs(self.head_dim)

        def grid_table(base: torch.Tensor) -> torch.Tensor:
            t_part, h_part, w_part = base.split((nt, nh, nw), dim=1)
            table = torch.cat(
                [
                    t_part[start : start + f].view(f, 1, 1, nt).expand(f, h, w, nt),
                    h_part[:h].view(1, h, 1, nh).expand(f, h, w, nh),
                    w_part[:w].view(1, 1, w, nw).expand(f, h, w, nw),
                ],
                dim=-1,
            )  # [f, h, w, head_dim/2]
            return table.reshape(f * h * w, 1, nt + nh + nw)  # [S, 1, head_dim/2]

        return RopeTable(grid_table(cos), grid_table(sin))

    def _device_base(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            base = self._base.get(device)
            if base is None:
                base = (self._cos.to(device), self._sin.to(device))
                self._base[device] = base
            return base
