"""Build a CausalDiT from the released checkpoint, or with random weights at any size.

Both paths build the module on the meta device and then materialise one tensor at a time on
the target device, so host memory never holds the model twice (18.5 B parameters released).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from model.checkpoint import CheckpointError, CheckpointLayout, assign_state_dict
from model.config import DiTConfig
from model.dit.model import CausalDiT
from model.shard_reader import iter_safetensors_parallel

SHARD_READERS = 4  # shards read at once (benchmarks/load_weights.py measures the rate)
TEXT_DIM_KEY = "text_embedding.0.weight"  # [dim, text_dim]: text_dim is not in config.json
INIT_STD = 0.02
# Per-block weights whose output is added to (or multiplies) the residual stream.
RESIDUAL_OUTPUTS = ("self_attn.o.weight", "cross_attn.o.weight", "ffn.2.weight",
                    "cam_scale_layer.weight", "cam_shift_layer.weight")


def load_dit(
    layout: CheckpointLayout,
    dtype: torch.dtype,
    device: torch.device | str,
    local_attn_size: int | None = None,
    sink_size: int | None = None,
) -> CausalDiT:
    """Load the DiT of `layout` cast to `dtype` on `device`; its config is `dit.cfg`.

    `local_attn_size` / `sink_size` override the config.json defaults (None keeps them).
    """
    files = layout.dit_weight_files()
    shapes = _header_shapes(files)
    text_key_file = next((f for f, keys in shapes.items() if TEXT_DIM_KEY in keys), None)
    if text_key_file is None:
        raise CheckpointError(f"{layout.dit_dir}: no tensor {TEXT_DIM_KEY!r} to infer text_dim from")
    text_dim = shapes[text_key_file][TEXT_DIM_KEY][1]
    try:
        cfg = DiTConfig.from_json(layout.dit_config(), text_dim, local_attn_size, sink_size)
    except (AssertionError, ValueError) as exc:
        raise CheckpointError(f"{layout.dit_dir / 'config.json'}: {exc}") from exc
    with torch.device("meta"):
        dit = CausalDiT(cfg)
    _check_shapes(dit, shapes)
    source = files[0] if len(files) == 1 else layout.dit_dir
    # the shards read in parallel, into page-locked buffers when a GPU receives them
    tensors = iter_safetensors_parallel(files, workers=SHARD_READERS, pin=torch.device(device).type == "cuda")
    assign_state_dict(dit, tensors, source, dtype, device)
    return dit.eval()


def init_dit_random(
    cfg: DiTConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    residual_scaled: bool = False,
) -> CausalDiT:
    """A CausalDiT with seeded random weights created directly on `device`.

    Linear/Conv weights ~ N(0, 0.02), biases 0, norm weights 1, modulations ~ N(0, 1/sqrt(dim)).
    `residual_scaled`: the layers that write into the residual stream (RESIDUAL_OUTPUTS) get
    std 0.02 / sqrt(2 * num_layers) instead (GPT-2 style), so the 40 camera factors (1 + scale)
    stay near 1 as in a trained model; see docs/PERFORMANCE.md "Numerics". Same random stream.
    """
    device = torch.device(device)
    residual_std = INIT_STD / math.sqrt(2 * cfg.num_layers)
    with torch.device("meta"):
        dit = CausalDiT(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in list(dit.named_parameters()):
        value = torch.empty(param.shape, dtype=dtype, device=device)
        if name.endswith("modulation"):
            value.normal_(0.0, cfg.dim**-0.5, generator=gen)
        elif ".norm" in name and name.endswith("weight"):
            value.fill_(1.0)
        elif name.endswith("bias"):
            value.zero_()
        elif residual_scaled and name.startswith("blocks.") and name.endswith(RESIDUAL_OUTPUTS):
            value.normal_(0.0, residual_std, generator=gen)
        else:
            value.normal_(0.0, INIT_STD, generator=gen)
        *path, leaf = name.split(".")
        dit.get_submodule(".".join(path))._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    return dit.eval()


def _header_shapes(files: list[Path]) -> dict[Path, dict[str, tuple[int, ...]]]:
    """Tensor shapes per file, read from the safetensors headers (no tensor is loaded)."""
    from safetensors import safe_open

    shapes: dict[Path, dict[str, tuple[int, ...]]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                shapes[f] = {k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()}
        except Exception as exc:  # safetensors raises its own error types for bad files
            raise CheckpointError(f"cannot read {f}: {exc}") from exc
    return shapes


def _check_shapes(dit: CausalDiT, shapes: dict[Path, dict[str, tuple[int, ...]]]) -> None:
    """Fail before reading any weight when a file holds an unknown key or a wrong shape."""
    expected = {k: tuple(v.shape) for k, v in dit.state_dict().items()}
    for f, tensors in shapes.items():
        for key, shape in tensors.items():
            if key not in expected:
                raise CheckpointError(f"{f}: unexpected tensor {key!r} {shape}")
            if shape != expected[key]:
                raise CheckpointError(
                    f"{f}: tensor {key!r} has shape {shape}, expected {expected[key]} "
                    f"(config.json and weights disagree?)"
                )
    present = {k for tensors in shapes.values() for k in tensors}
    missing = sorted(set(expected) - present)
    if missing:
        names = ", ".join(str(f) for f in shapes)
        shown = ", ".join(f"{k} {expected[k]}" for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{names}: missing tensors {shown}{more} (truncated checkpoint?)")
