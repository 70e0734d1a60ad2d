"""CausalDiT: the LingBot-World-Fast transformer (spec A.2, A.3), weights only.

The module is stateless: per-session state (KV and cross-attention caches) is passed in
(`DiTCaches`), the text embedding is computed once per session (`embed_text`) and the camera
path once per chunk (`camera_features`), then reused by the 5 calls of the chunk. Parameter
names are exactly the released state-dict keys.

Precision: the weights' dtype is the compute dtype of every Linear/Conv; the time embedding,
modulation and head run in float32 (weights upcast), the residual stream is float32, RoPE
float64 (spec A.7). In float32 this reproduces the reference's recorded outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.config import DiTConfig
from model.dit.block import DiTBlock, layer_norm
from model.dit.caches import DiTCaches
from model.dit.rope import Rope3D, RopeTable

PIXELS_PER_LATENT = 64  # Plücker channels per component: the 8x8 pixels of one latent cell
# The reference embeds the timestep once per token (a GEMM of S rows). BLAS picks its kernel by
# the row count and a 1-row product rounds differently, so a few identical rows are embedded
# and the first is used: free (bound by reading the weights), and bit-identical on CPU.
TIME_ROWS = 8


@dataclass(frozen=True, slots=True)
class CameraFeatures:
    """One chunk's camera conditioning: per block (1 + cam_scale, cam_shift), [1, S, dim]."""

    scale: tuple[torch.Tensor, ...]
    shift: tuple[torch.Tensor, ...]

    @property
    def tokens(self) -> int:
        return self.scale[0].shape[1]


def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """[cos, sin] embedding of positions t [N] in float64 (cos first) -> [N, dim]."""
    half = dim // 2
    pos = t.to(torch.float64)
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=t.device).div(half))
    s = torch.outer(pos, freqs)
    return torch.cat([torch.cos(s), torch.sin(s)], dim=1)


def linear_fp32(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A Linear computed in float32 whatever the weights' dtype (the reference's inner autocast)."""
    return F.linear(x.float(), layer.weight.float(), layer.bias.float())


class Head(nn.Module):
    def __init__(self, dim: int, out_features: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.modulation = nn.Parameter(torch.zeros(1, 2, dim))
        self.head = nn.Linear(dim, out_features)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """x [1, S, dim] float32, e [1, 1, dim] (time embedding, not e0) -> [1, S, out] float32."""
        shift, scale = (self.modulation.float()[None] + e[:, :, None]).unbind(2)  # [1, 1, dim] each
        return linear_fp32(self.head, layer_norm(x, self.eps) * (1 + scale) + shift)


class CausalDiT(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch, stride=cfg.patch)
        cam_features = cfg.control_dim * PIXELS_PER_LATENT * math.prod(cfg.patch)
        self.patch_embedding_wancamctrl = nn.Linear(cam_features, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.num_layers))
        self.head = Head(dim, cfg.patch_features, cfg.eps)
        self.rope = Rope3D(cfg.head_dim)  # plain attribute: not part of the state dict
        # Math dtype of the rotary tables: float64 reproduces the reference (spec A.7); the GPU
        # transforms (model/accel) set float32.
        self.rope_dtype = torch.float64

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of the Linear/Conv layers (= the weights' dtype)."""
        return self.patch_embedding.weight.dtype

    def embed_text(self, context: torch.Tensor) -> torch.Tensor:
        """T5 output [L, text_dim] -> [1, text_len, dim]: zero rows to text_len, then the MLP."""
        cfg = self.cfg
        if context.ndim != 2 or context.shape[1] != cfg.text_dim or context.shape[0] > cfg.text_len:
            raise ValueError(
                f"text context must be [L <= {cfg.text_len}, {cfg.text_dim}], got {tuple(context.shape)}"
            )
        pad = context.new_zeros(cfg.text_len - context.shape[0], cfg.text_dim)
        u = torch.cat([context, pad]).to(self.dtype)[None]  # [1, text_len, text_dim]
        return self.text_embedding(u)

    def camera_features(self, plucker: torch.Tensor) -> CameraFeatures:
        """Plücker [1, 6*64, f, H, W] -> per-block camera modulation of the chunk (A.3 step 4)."""
        pt, ph, pw = self.cfg.patch
        channels = self.cfg.control_dim * PIXELS_PER_LATENT
        if (
            plucker.ndim != 5
            or plucker.shape[:2] != (1, channels)
            or any(n % p for n, p in zip(plucker.shape[2:], self.cfg.patch))
        ):
            raise ValueError(
                f"plucker must be [1, {channels}, f, H, W] with (f, H, W) multiples of the patch "
                f"{self.cfg.patch}, got {tuple(plucker.shape)}"
            )
        _, c, f, h, w = plucker.shape
        pl = plucker.to(self.dtype).view(1, c, f // pt, pt, h // ph, ph, w // pw, pw)
        pl = pl.permute(0, 2, 4, 6, 1, 3, 5, 7)  # [1, f', h', w', c, pt, ph, pw]
        pl = pl.reshape(1, (f // pt) * (h // ph) * (w // pw), c * pt * ph * pw)  # [1, S, c*pt*ph*pw]
        p = self.patch_embedding_wancamctrl(pl)
        p = p + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(p)))
        scales, shifts = zip(*(block.camera_modulation(p) for block in self.blocks))
        return CameraFeatures(scale=tuple(scales), shift=tuple(shifts))

    def time_embed(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """t [1] -> e [1, 1, dim], e0 [1, 1, 6, dim], float32 (the same for every token)."""
        rows = t.reshape(1).expand(TIME_ROWS)
        sin = sinusoidal_embedding(self.cfg.freq_dim, rows).float()  # [TIME_ROWS, freq_dim]
        te, tp = self.time_embedding, self.time_projection
        e = linear_fp32(te[2], F.silu(linear_fp32(te[0], sin)))  # [TIME_ROWS, dim]
        e0 = linear_fp32(tp[1], F.silu(e)).unflatten(1, (6, self.cfg.dim))  # [TIME_ROWS, 6, dim]
        return e[None, :1], e0[None, :1]

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
        """One chunk: x [16, f, H, W], t [1], y [20, f, H, W] -> velocity float32 [16, f, H, W].

        `start` is the chunk's first token (chunk index * f * frame_seqlen); the call writes
        the chunk's K/V into `caches` (spec A.5).
        """
        h, e, e0, rope, grid = self._enter(x, t, y, text, cam, caches, start)
        # 4. Blocks
        h = self.run_blocks(h, e0, rope, cam, text, caches, start, len(self.blocks))
        # 5. Head: [1, S, dim] -> [1, S, pt*ph*pw*16] (channel-minor patches)
        out = self.head(h, e)
        # 6. Unpatchify
        return self.unpatchify(out, grid)

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
        """`forward`'s writes into `caches` without its output, for a call whose output is
        discarded (the t = 0 cache update): the same blocks up to the last one's K/V write;
        the last block's attention, cross-attention and FFN and the head only make the velocity."""
        h, _, e0, rope, _ = self._enter(x, t, y, text, cam, caches, start)
        self.run_blocks_kv(h, e0, rope, cam, text, caches, start)

    def _enter(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, text: torch.Tensor, cam: CameraFeatures,
        caches: DiTCaches, start: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RopeTable, tuple[int, int, int]]:
        """Checks, then the blocks' inputs: (tokens [1, S, dim], e, e0, rotary table, grid)."""
        pt, ph, pw = self.cfg.patch
        self._check_inputs(x, t, y, text, caches)
        grid = (x.shape[1] // pt, x.shape[2] // ph, x.shape[3] // pw)
        frame_seqlen = grid[1] * grid[2]
        tokens = math.prod(grid)
        if cam.tokens != tokens:
            raise ValueError(f"camera features have {cam.tokens} tokens, the chunk has {tokens}")
        if start < 0 or start % frame_seqlen:
            raise ValueError(f"start token {start} is not a multiple of frame_seqlen {frame_seqlen}")
        # 1. Patchify: [36, f, H, W] -> [1, S, dim] tokens in (f, h, w) raster order
        u = self.patch_embedding(torch.cat([x, y]).to(self.dtype)[None])  # [1, dim, f', h', w']
        h = u.flatten(2).transpose(1, 2).contiguous()  # [1, S, dim]
        # 2. Time: one embedding broadcast over the tokens
        e, e0 = self.time_embed(t)
        # 3. Rotary table of the chunk, at its absolute frame offset
        rope = self.rope.chunk_table(start // frame_seqlen, grid, x.device, self.rope_dtype)
        return h, e, e0, rope, grid

    def run_blocks(self, h: torch.Tensor, e0: torch.Tensor, rope: RopeTable, cam: CameraFeatures,
                text: torch.Tensor, caches: DiTCaches, start: int, count: int) -> torch.Tensor:
        """The first `count` blocks on the residual h [1, S, dim] (`rope`: what the blocks pass
        through to their self-attention; a ShardedRope under sequence parallelism)."""
        for i, block in enumerate(self.blocks[:count]):
            h = block(
                h, e0, rope, cam.scale[i], cam.shift[i], text,
                caches.self_attn[i], caches.cross_attn[i], start, self.dtype,
            )
        return h

    def run_blocks_kv(self, h: torch.Tensor, e0: torch.Tensor, rope: RopeTable, cam: CameraFeatures,
                      text: torch.Tensor, caches: DiTCaches, start: int) -> None:
        """`run_blocks` over every block for its cache writes only: the last block stops at its K/V."""
        h = self.run_blocks(h, e0, rope, cam, text, caches, start, len(self.blocks) - 1)
        self.blocks[-1].write_kv(h, e0, rope, caches.self_attn[-1], start, self.dtype)

    def unpatchify(self, out: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """Head output [1, S, pt*ph*pw*16] -> [16, f, H, W] ('f h w p q r c -> c (f p) (h q) (w r)')."""
        pt, ph, pw = self.cfg.patch
        out = out.view(*grid, pt, ph, pw, self.cfg.out_dim).permute(6, 0, 3, 1, 4, 2, 5)
        return out.reshape(self.cfg.out_dim, grid[0] * pt, grid[1] * ph, grid[2] * pw)

    def _check_inputs(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, text: torch.Tensor, caches: DiTCaches
    ) -> None:
        cfg = self.cfg
        if x.ndim != 4 or x.shape[0] != cfg.out_dim:
            raise ValueError(f"x must be [{cfg.out_dim}, f, H, W], got {tuple(x.shape)}")
        if any(n % p for n, p in zip(x.shape[1:], cfg.patch)):
            raise ValueError(f"x size {tuple(x.shape[1:])} must be a multiple of the patch {cfg.patch}")
        y_shape = (cfg.in_dim - cfg.out_dim, *x.shape[1:])
        if y.shape != y_shape:
            raise ValueError(f"y must be {list(y_shape)}, got {tuple(y.shape)}")
        if t.numel() != 1:
            raise ValueError(f"t must hold one timestep, got shape {tuple(t.shape)}")
        text_shape = (1, cfg.text_len, cfg.dim)
        if text.shape != text_shape:
            raise ValueError(f"text must be the embed_text() output {list(text_shape)}, got {tuple(text.shape)}")
        if len(caches.self_attn) != cfg.num_layers:
            raise ValueError(f"caches have {len(caches.self_attn)} layers, the model {cfg.num_layers}")
