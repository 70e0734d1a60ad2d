"""The UMT5 encoder's weights in int8 (opt-in `text_weights: int8`): half the text encoder's memory.

UMT5-XXL's encoder is 10.6 GiB in bf16, 14 % of an 80 GB card, for one forward per prompt (the
replicas cache prompts). Stored as int8 with a float32 scale per group of 128 weights along a
row (`max |W[n, group]| / 127`; the token table the same per token row), it is 5.5 GiB, and each
call dequantizes one matrix at a time into the compute dtype (weight-only: the matmuls and
activations stay bf16, so every GPU runs it, A100 included). Rounding is at most half a step per
weight, 1/254 of its group's largest (tests/model/test_text_int8.py measures what it does to the
context).

The modules keep the names and shapes of what they replace (`weight`, int8, `[N, K]`), so the
checkpoint's keys load into them and transformers' UMT5 sees an int8 `wo.weight`, which it already
knows not to cast its activations to. Quantization runs in row blocks where the tensor lies (the
host for a checkpoint, the device for random weights), so loading never holds a whole bf16 copy.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QMAX = 127
GROUP = 128  # weights sharing one scale along a row: a row's largest outlier costs only its group
BLOCK_ROWS = 4096  # rows quantized at a time: 4096 x 4096 float32 = 64 MiB transient


def groups(cols: int) -> int:
    """Scales per row of `cols` weights (a group of GROUP, or the whole row when shorter)."""
    return max(1, cols // GROUP) if cols % GROUP == 0 else 1


@torch.no_grad()
def quantize_rows(weight: Tensor, block_rows: int = BLOCK_ROWS) -> tuple[Tensor, Tensor]:
    """(codes int8 [N, K], scales float32 [N, G]) with weight ~= codes * scales per group of K / G."""
    n, k = weight.shape
    g = groups(k)
    codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(n, g, dtype=torch.float32, device=weight.device)
    for lo in range(0, n, block_rows):
        rows = weight[lo:lo + block_rows].float().view(-1, g, k // g)
        scale = rows.abs().amax(dim=2).clamp_min(torch.finfo(torch.float32).tiny) / QMAX
        codes[lo:lo + block_rows] = torch.round(rows / scale[..., None]).clamp_(-QMAX, QMAX).view(-1, k).to(torch.int8)
        scales[lo:lo + block_rows] = scale
    return codes, scales


def dequantize(codes: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    shape, g = codes.shape, scales.shape[-1]
    return (codes.float().view(*shape[:-1], g, -1) * scales[..., None]).view(shape).to(dtype)


class _Int8Rows(nn.Module):
    """Rows of int8 codes (`weight`, [rows, cols]) with float32 scales per row group (`scale`),
    computed in `dtype`: the storage both int8 modules share."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.register_buffer("weight", torch.empty(rows, cols, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(rows, groups(cols), dtype=torch.float32))


class Int8Linear(_Int8Rows):
    """y = x dequantize(codes)^T in `dtype`; bias-free, as UMT5's projections are."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().__init__(out_features, in_features, dtype)
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.to(self.dtype), dequantize(self.weight, self.scale, self.dtype))


class Int8Embedding(_Int8Rows):
    """Token rows as int8 with scales per row group; only the looked-up rows are dequantized."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__(num_embeddings, embedding_dim, dtype)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim

    def forward(self, ids: Tensor) -> Tensor:
        return dequantize(F.embedding(ids, self.weight), F.embedding(ids, self.scale), self.dtype)


def _int8_form(name: str, module: nn.Module, dtype: torch.dtype) -> nn.Module | None:
    """The int8 module standing in for `module`, or None where it stays (not a matrix we store)."""
    if isinstance(module, nn.Linear):
        assert module.bias is None, f"{name}: UMT5's projections have no bias"
        return Int8Linear(module.in_features, module.out_features, dtype)
    if isinstance(module, nn.Embedding) and "relative_attention_bias" not in name:  # the token table
        return Int8Embedding(module.num_embeddings, module.embedding_dim, dtype)
    return None  # norms, the relative-position tables (a few KiB)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def swap_in_int8(model: nn.Module, dtype: torch.dtype) -> set[str]:
    """Replace `model`'s Linears and token table (on the meta device, before loading) by their int8
    forms. Returns the names of the swapped modules' `weight`s (what `quantized_tensors` quantizes)."""
    names: set[str] = set()
    for name, module in list(model.named_modules()):
        new = _int8_form(name, module, dtype)
        if new is not None:
            _replace(model, name, new)
            names.add(f"{name}.weight")
    return names


@torch.no_grad()
def quantize_loaded(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` (loaded) with the same modules swapped for int8 forms of their weights, in place:
    what loading with `int8` gives from the same weights (probes and tests)."""
    for name, module in list(model.named_modules()):
        new = _int8_form(name, module, dtype)
        if new is not None:
            new.weight, new.scale = quantize_rows(module.weight)
            _replace(model, name, new)
    return model


def quantized_tensors(tensors: Iterator[tuple[str, Tensor]], names: set[str],
                      device: torch.device | str) -> Iterator[tuple[str, Tensor]]:
    """The checkpoint's (key, tensor) with each of `names` as its int8 codes and `.scale`,
    quantized where the tensor lies and then moved to `device`."""
    for key, value in tensors:
        if key in names:
            codes, scales = quantize_rows(value)
            yield key, codes.to(device)
            yield key.removesuffix("weight") + "scale", scales.to(device)
        else:
            yield key, value


def nbytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

