"""Where the bf16 error of the DiT comes from (CPU study at reduced width, released depth).

One DiT call (chunk 0, fresh caches) is computed by `emulated_forward`, a float32 copy of
`DiTBlock.forward` in which each group of ops can round its tensors to bf16 exactly where the
GPU bf16 path does (a bf16 GEMM = bf16 inputs, float32 accumulation, bf16 output). Switching
groups on one at a time, or all but one, locates the error; perturbing the float32 inputs
measures the network's own sensitivity. The blocks are drawn one at a time into one module
and every variant advances through them in lockstep, so the released width (5120) fits in a
few GiB of host memory. Results: docs/PERFORMANCE.md, "Numerics".

    python -m benchmarks.precision_study --dim 1024 --layers 10 20 40 --init 0.02 residual \
        --text-len 64 --groups camera cam_out cam_plus1
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from model.dit.plucker import plucker_embedding
from model.config import DiTConfig
from model.dit.model import CausalDiT, PIXELS_PER_LATENT
from model.dit.block import DiTBlock
from model.dit.loader import INIT_STD, RESIDUAL_OUTPUTS

GROUPS = ("inputs", "patch", "text", "camera", "cam_out", "cam_plus1", "mod_in", "qkv", "kv", "attn", "o",
          "cross", "ffn")
# camera: the camera GEMMs' inputs and features p, hs; cam_out: the scale/shift GEMM outputs;
# cam_plus1: 1 + scale stored in bf16 (the reference's `(1.0 + cam_scale) * x` under autocast)


@dataclass(frozen=True)
class Rounding:
    """Which op groups round to bf16 (the GPU bf16 path rounds all of them)."""

    on: frozenset[str] = field(default_factory=frozenset)

    def r(self, group: str, t: torch.Tensor) -> torch.Tensor:
        return t.bfloat16().float() if group in self.on else t


def lin(layer: torch.nn.Linear, x: torch.Tensor, rd: Rounding, group: str) -> torch.Tensor:
    return rd.r(group, F.linear(rd.r(group, x), layer.weight, layer.bias))


def rms(norm: torch.nn.Module, x: torch.Tensor, rd: Rounding, group: str) -> torch.Tensor:
    n = rd.r(group, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps))
    return rd.r(group, n * norm.weight)


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rd: Rounding, group: str) -> torch.Tensor:
    """[S, H, D] x [n, H, D] -> [S, H*D]: float32 softmax, P and output rounded like flash."""
    q, k, v = (rd.r(group, t).transpose(0, 1) for t in (q, k, v))  # [H, *, D]
    p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
    return rd.r(group, rd.r(group, p) @ v).transpose(0, 1).flatten(1)


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    pairs = t.double().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).float()


def _forward(dit: CausalDiT, x, t, y, context, plucker, rd: Rounding, trace: list | None):
    """Generator of one emulated call: is sent the blocks one by one, then None; returns [S, 64]."""
    cfg = dit.cfg
    f, h, w = x.shape[1], x.shape[2] // 2, x.shape[3] // 2
    u = F.conv3d(rd.r("inputs", torch.cat([x, y]))[None], dit.patch_embedding.weight,
                 dit.patch_embedding.bias, stride=cfg.patch)
    xs = rd.r("patch", u.flatten(2).transpose(1, 2)[0])  # [S, dim]
    first_bf16 = "patch" in rd.on
    ctx = torch.cat([context, context.new_zeros(cfg.text_len - context.shape[0], cfg.text_dim)])
    te = dit.text_embedding
    text = lin(te[2], rd.r("text", F.gelu(lin(te[0], rd.r("inputs", ctx), rd, "text"), approximate="tanh")), rd, "text")
    c = plucker.shape[1]
    pl = rd.r("inputs", plucker).view(1, c, f, h, 2, w, 2).permute(0, 2, 3, 5, 1, 4, 6).reshape(f * h * w, -1)
    p = lin(dit.patch_embedding_wancamctrl, pl, rd, "camera")
    p = rd.r("camera", p + lin(dit.c2ws_hidden_states_layer2,
                               rd.r("camera", F.silu(lin(dit.c2ws_hidden_states_layer1, p, rd, "camera"))), rd, "camera"))
    e, e0 = dit.time_embed(t)
    e, e0 = e[0, 0], e0[0, 0]  # [dim], [6, dim]
    table = dit.rope.chunk_table(0, (f, h, w), "cpu", torch.float64)
    cos, sin = table.cos, table.sin
    heads, hd = cfg.num_heads, cfg.head_dim
    i = 0
    while (blk := (yield)) is not None:
        sh_sa, sc_sa, g_sa, sh_ff, sc_ff, g_ff = (blk.modulation[0] + e0).unbind(0)
        ln = F.layer_norm(xs, (cfg.dim,), eps=cfg.eps)
        if i == 0 and first_bf16:
            ln = ln.bfloat16().float()
        a = rd.r("mod_in", ln * (1 + sc_sa) + sh_sa)
        sa = blk.self_attn
        q = rms(sa.norm_q, lin(sa.q, a, rd, "qkv"), rd, "qkv").view(-1, heads, hd)
        k = rms(sa.norm_k, lin(sa.k, a, rd, "qkv"), rd, "qkv").view(-1, heads, hd)
        v = lin(sa.v, a, rd, "qkv").view(-1, heads, hd)
        q, k = rd.r("qkv", rope(q, cos, sin)), rd.r("kv", rd.r("qkv", rope(k, cos, sin)))
        att = flash(q, k, rd.r("kv", v), rd, "attn")
        xs = xs + lin(sa.o, att, rd, "o") * g_sa
        hs = rd.r("camera", lin(blk.cam_injector_layer2, rd.r("camera", F.silu(lin(blk.cam_injector_layer1, p, rd, "camera"))), rd, "camera") + p)
        scale = rd.r("cam_plus1", 1.0 + rd.r("cam_out", F.linear(hs, blk.cam_scale_layer.weight, blk.cam_scale_layer.bias)))
        xs = scale * xs + rd.r("cam_out", F.linear(hs, blk.cam_shift_layer.weight, blk.cam_shift_layer.bias))
        ca = blk.cross_attn
        cn = F.layer_norm(xs, (cfg.dim,), blk.norm3.weight, blk.norm3.bias, blk.norm3.eps)
        cq = rms(ca.norm_q, lin(ca.q, cn, rd, "cross"), rd, "cross").view(-1, heads, hd)
        ck = rms(ca.norm_k, lin(ca.k, text, rd, "cross"), rd, "cross").view(-1, heads, hd)
        cv = lin(ca.v, text, rd, "cross").view(-1, heads, hd)
        xs = xs + lin(ca.o, flash(cq, ck, cv, rd, "cross"), rd, "cross")
        hf = rd.r("mod_in", F.layer_norm(xs, (cfg.dim,), eps=cfg.eps) * (1 + sc_ff) + sh_ff)
        up = rd.r("ffn", F.gelu(lin(blk.ffn[0], hf, rd, "ffn"), approximate="tanh"))
        xs = xs + lin(blk.ffn[2], up, rd, "ffn") * g_ff
        if trace is not None:
            trace.append(xs.clone())
        i += 1
    hsh, hsc = (dit.head.modulation[0] + e).unbind(0)
    return F.linear(F.layer_norm(xs, (cfg.dim,), eps=cfg.eps) * (1 + hsc) + hsh, dit.head.head.weight, dit.head.head.bias)


@torch.no_grad()
def lockstep(dit: CausalDiT, runs: dict[str, tuple[tuple, Rounding]], blocks: Iterable[DiTBlock],
             trace: list | None = None) -> dict[str, torch.Tensor]:
    """Emulated calls {name: (inputs, rounding)} advanced block by block (each block is drawn
    once for all of them) -> {name: [S, 64]}; `trace` gets the first run's residual per block."""
    gens = {k: _forward(dit, *inp, rd, trace if j == 0 else None) for j, (k, (inp, rd)) in enumerate(runs.items())}
    for g in gens.values():
        next(g)
    for blk in blocks:
        for g in gens.values():
            g.send(blk)
    outs = {}
    for k, g in gens.items():
        try:
            g.send(None)
        except StopIteration as stop:
            outs[k] = stop.value
    return outs


def emulated_forward(dit: CausalDiT, x, t, y, context, plucker, rd: Rounding, trace: list | None = None):
    """One chunk-0 call of a float32 `dit` with bf16 rounding per `rd` -> [S, 64] float32."""
    return lockstep(dit, {"": ((x, t, y, context, plucker), rd)}, dit.blocks, trace)[""]


def errs(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max|a-b| / max|b|, ||a-b|| / ||b||)."""
    d = (a - b).double()
    return (d.abs().max() / b.abs().max()).item(), (d.norm() / b.double().norm()).item()


def make_inputs(lat_h: int, lat_w: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 3, lat_h, lat_w, generator=gen)
    y = torch.randn(20, 3, lat_h, lat_w, generator=gen)
    context = torch.randn(24, 4096, generator=gen) * 0.2
    poses = torch.eye(4).repeat(3, 1, 1)
    poses[:, 2, 3] = torch.tensor([0.0, 0.5, 1.0])  # a forward walk (translation-scaled units)
    h, w = lat_h * 8, lat_w * 8
    pl = plucker_embedding(poses, [w, w, w / 2, h / 2], h, w)  # [1, 384, 3, lat_h, lat_w]
    assert pl.shape[1] == 6 * PIXELS_PER_LATENT
    return x, torch.tensor([900.0]), y, context, pl


INITS = ("0.02", "fan_in", "residual")


def draw(name: str, shape: torch.Size, dim: int, layers: int, init: str, gen: torch.Generator) -> torch.Tensor:
    """One bf16-valued float32 parameter: `init_dit_random`'s rule ('0.02'), or its matrices
    with std 1/sqrt(fan_in) ('fan_in') or `init_dit_random(residual_scaled=True)`'s rule
    ('residual': RESIDUAL_OUTPUTS at 0.02/sqrt(2 layers))."""
    if name.endswith("modulation"):
        t = torch.randn(shape, generator=gen) * dim**-0.5
    elif ".norm" in name and name.endswith("weight"):
        t = torch.ones(shape)
    elif name.endswith("bias"):
        t = torch.zeros(shape)
    else:
        residual = name.startswith("blocks.") and name.endswith(RESIDUAL_OUTPUTS)
        std = {"0.02": INIT_STD, "fan_in": shape[1:].numel() ** -0.5,
               "residual": INIT_STD / math.sqrt(2 * layers) if residual else INIT_STD}[init]
        t = torch.randn(shape, generator=gen) * std
    return t.bfloat16().float()


def redraw(module: torch.nn.Module, prefix: str, layers: int, init: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim = next(m for m in module.modules() if hasattr(m, "modulation")).modulation.shape[-1]
    for name, prm in module.named_parameters():
        prm.data = draw(prefix + name, prm.shape, dim, layers, init, gen)


def drawn_blocks(block: DiTBlock, layers: int, init: str, seed: int) -> Iterator[DiTBlock]:
    """`layers` blocks drawn one at a time into `block` (memory of one block at any depth)."""
    for i in range(layers):
        redraw(block, "blocks.0.", layers, init, seed * 1000 + i)
        yield block


def study(dim: int, layers: int, init: str, lat: tuple[int, int], groups: tuple[str, ...], text_len: int = 512,
          seed: int = 0) -> dict:
    """Errors of one emulated call (chunk 0) at (dim, layers, init) against float32."""
    cfg = DiTConfig(dim=dim, ffn_dim=int(dim * 13824 / 5120) // 64 * 64, num_heads=dim // 128, num_layers=1,
                    text_len=text_len)
    with torch.device("meta"):
        dit = CausalDiT(cfg)
    dit = dit.to_empty(device="cpu").float()
    head = {n: p for n, p in dit.named_parameters() if not n.startswith("blocks.")}
    gen = torch.Generator().manual_seed(seed)
    for name, prm in head.items():
        prm.data = draw(name, prm.shape, dim, layers, init, gen)
    inputs = make_inputs(*lat)
    x, t, y, ctx, pl = inputs
    noise = torch.Generator().manual_seed(123)
    allr = Rounding(frozenset(GROUPS))
    runs = {"fp32": (inputs, Rounding()), "all_bf16": (inputs, allr),
            "fp32_x_bf16_rounded": ((x.bfloat16().float(), t, y, ctx, pl), Rounding()),
            "fp32_x_noise_1e-3": ((x * (1 + 1e-3 * torch.randn(x.shape, generator=noise)), t, y, ctx, pl), Rounding())}
    runs.update({f"only_{g}": (inputs, Rounding(frozenset({g}))) for g in groups})
    runs.update({f"all_but_{g}": (inputs, Rounding(frozenset(GROUPS) - {g})) for g in groups})
    trace: list[torch.Tensor] = []
    outs = lockstep(dit, runs, drawn_blocks(dit.blocks[0], layers, init, seed), trace)
    ref = outs.pop("fp32")
    res = {"dim": dim, "layers": layers, "init": init,
           "residual_rms": [round(r.pow(2).mean().sqrt().item(), 3) for r in trace[:: max(1, layers // 5)]]}
    res.update({k: [float(f"{e:.3g}") for e in errs(o, ref)] for k, o in outs.items()})
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, nargs="+", default=[40])
    ap.add_argument("--init", nargs="+", default=["0.02"], choices=INITS)
    ap.add_argument("--lat", type=int, nargs=2, default=(8, 14))
    ap.add_argument("--groups", nargs="*", default=(), help="op groups to probe (only / all but), e.g. "
                    + " ".join(GROUPS))
    ap.add_argument("--text-len", type=int, default=512, help="text tokens (512 released; fewer is faster)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for layers in args.layers:
        for init in args.init:
            print(json.dumps(study(args.dim, layers, init, tuple(args.lat), tuple(args.groups), args.text_len)), flush=True)


if __name__ == "__main__":
    main()
