"""Clocks, device ceilings, analytic FLOPs and memory accounting of the benchmark."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from camera.frames import CHUNK_LATENT_FRAMES
from model.config import DiTConfig

GIB = 1024**3
DENOISE_CALLS = 4  # + 1 cache-update call per chunk


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """(fn(), wall seconds) with the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 10) -> float:
    """bf16 n^3 matrix product rate on random data (mean of `iters` after 3 warm-ups)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _, dt = timed(lambda: [a @ b for _ in range(iters)], device)
    return 2 * n**3 * iters / dt / 1e12


def copy_tbps(device: torch.device, gib: float = 2.0, iters: int = 10) -> float:
    """Device-to-device copy rate, counting bytes read plus written."""
    src = torch.randn(int(gib * GIB) // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _, dt = timed(lambda: [dst.copy_(src) for _ in range(iters)], device)
    return 2 * src.nbytes * iters / dt / 1e12


def dit_call_flops_by_kind(cfg: DiTConfig, tokens: int, kv_tokens: int) -> dict[str, float]:
    """FLOPs of one DiT call on `tokens` tokens attending to `kv_tokens` (text K/V excluded):
    "gemm" (the blocks' projections and FFN, the patch embedding and head) and "attention"
    (self + cross)."""
    d, ff = cfg.dim, cfg.ffn_dim
    gemm = cfg.num_layers * 2 * tokens * (4 * d * d + 2 * d * d + 2 * d * ff)  # qkv+o, cross q+o, ffn
    gemm += 2 * tokens * cfg.in_dim * 4 * d + 2 * tokens * d * cfg.patch_features  # patch, head
    return {"gemm": gemm, "attention": cfg.num_layers * 4 * tokens * d * (kv_tokens + cfg.text_len)}


def dit_call_flops(cfg: DiTConfig, tokens: int, kv_tokens: int) -> float:
    """FLOPs of one DiT call on `tokens` tokens attending to `kv_tokens` (text K/V excluded)."""
    return sum(dit_call_flops_by_kind(cfg, tokens, kv_tokens).values())


def camera_flops(cfg: DiTConfig, tokens: int) -> float:
    """FLOPs of one chunk's camera path (patch embedding, 2 MLP layers, 4 GEMMs per block)."""
    d = cfg.dim
    return 2 * tokens * d * (cfg.control_dim * 64 * 4 + 2 * d + cfg.num_layers * 4 * d)


def chunk_flops_by_kind(cfg: DiTConfig, frame_seqlen: int, kv_tokens: int,
                        calls: int = DENOISE_CALLS + 1) -> dict[str, float]:
    """A chunk's FLOPs by kind: `calls` DiT calls attending to `kv_tokens` (the chunk's own among
    them), the camera path once (GEMMs)."""
    tokens = CHUNK_LATENT_FRAMES * frame_seqlen
    flops = {kind: calls * f for kind, f in dit_call_flops_by_kind(cfg, tokens, kv_tokens).items()}
    flops["gemm"] += camera_flops(cfg, tokens)
    return flops


def chunk_flops(cfg: DiTConfig, frame_seqlen: int, chunk: int, calls: int = DENOISE_CALLS + 1) -> float:
    """Chunk `chunk` of a full-attention session (it attends to chunks 0..chunk)."""
    kv = (chunk + 1) * CHUNK_LATENT_FRAMES * frame_seqlen
    return sum(chunk_flops_by_kind(cfg, frame_seqlen, kv, calls).values())


def camera_feature_bytes(cfg: DiTConfig, tokens: int, dtype: torch.dtype) -> int:
    """Per-block (1 + scale, shift) of one chunk."""
    return cfg.num_layers * 2 * tokens * cfg.dim * torch.empty((), dtype=dtype).element_size()


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's parameters and buffers on a real device (views counted once),
    plus the FP8 weights the fast blocks hold outside the parameters."""
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type == "meta":
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    for m in module.modules():
        for proj in getattr(m, "projections", lambda: {})().values():
            total += getattr(proj, "nbytes", 0)
    return total


class PeakMemory:
    """Peak allocated device memory over a region, relative to what was resident at its start."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = self.peak = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
