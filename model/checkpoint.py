"""The released checkpoint layout: discovery, file reading and strict state-dict assignment.

Layout (spec A.8, ../shared/ckpt/README.md)::

    <root>/                                   the "base-cam" directory
      lingbot_world_fast/ (or Lingbot-World-Fast/)
        config.json
        diffusion_pytorch_model.safetensors                      single file, or
        diffusion_pytorch_model.safetensors.index.json + shards
      models_t5_umt5-xxl-enc-bf16.pth
      google/umt5-xxl/                        tokenizer
      Wan2.1_VAE.pth

Weights are never held twice in host RAM: `.pth` files are memory-mapped
(`torch.load(mmap=True)`), safetensors are read tensor by tensor, and every tensor is cast
and copied straight into a module that was built on the meta device (`assign_state_dict`).
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

DIT_SUBDIRS = ("lingbot_world_fast", "Lingbot-World-Fast")
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
TOKENIZER_DIR = "google/umt5-xxl"
VAE_FILE = "Wan2.1_VAE.pth"
SAFETENSORS_FILE = "diffusion_pytorch_model.safetensors"
SAFETENSORS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or does not match the model."""


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    """Resolved paths of one released checkpoint."""

    root: Path
    dit_dir: Path
    t5_file: Path
    tokenizer_dir: Path
    vae_file: Path

    @classmethod
    def discover(cls, root: str | Path) -> "CheckpointLayout":
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint root {root} is not a directory")
        dit_dir = next((root / d for d in DIT_SUBDIRS if (root / d).is_dir()), None)
        if dit_dir is None:
            raise CheckpointError(
                f"no DiT folder in {root}: expected one of {', '.join(DIT_SUBDIRS)} "
                "(download robbyant/lingbot-world-fast into <root>/lingbot_world_fast/)"
            )
        layout = cls(root, dit_dir, root / T5_FILE, root / TOKENIZER_DIR, root / VAE_FILE)
        for path, what in ((layout.t5_file, "T5 encoder"), (layout.vae_file, "VAE")):
            if not path.is_file():
                raise CheckpointError(
                    f"missing {what} file {path} (from robbyant/lingbot-world-base-cam)"
                )
        if not (layout.tokenizer_dir / "tokenizer.json").is_file():
            raise CheckpointError(f"missing tokenizer {layout.tokenizer_dir / 'tokenizer.json'}")
        return layout

    def dit_config(self) -> dict:
        path = self.dit_dir / "config.json"
        if not path.is_file():
            raise CheckpointError(f"missing DiT config {path}")
        return json.loads(path.read_text())

    def dit_weight_files(self) -> list[Path]:
        """The safetensors files of the DiT: the single file or the shards of the index."""
        index = self.dit_dir / SAFETENSORS_INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [self.dit_dir / name for name in sorted(set(weight_map.values()))]
        else:
            files = [self.dit_dir / SAFETENSORS_FILE]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"missing DiT weight file {f}")
        return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (key, tensor) one at a time from safetensors files (no whole-file copy)."""
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for key in sf.keys():
                    yield key, sf.get_tensor(key)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own error types for truncation
            raise CheckpointError(f"cannot read {f}: {exc}") from exc


def load_pth(path: Path) -> dict[str, torch.Tensor]:
    """Memory-map a torch-saved state dict (weights_only)."""
    if not Path(path).is_file():
        raise CheckpointError(f"missing checkpoint file {path}")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path} does not hold a state dict")
    return dict(sd)


def shape_of(sd: Mapping[str, torch.Tensor], key: str, source: Path) -> tuple[int, ...]:
    """Shape of `key`, or a CheckpointError naming the file (used to infer dims)."""
    if key not in sd:
        raise CheckpointError(f"{source}: missing tensor {key!r} needed to infer model dims")
    return tuple(sd[key].shape)


def assign_state_dict(
    module: nn.Module,
    tensors: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]],
    source: Path | str,
    dtype: torch.dtype,
    device: torch.device | str,
    exact: frozenset[str] = frozenset(),
) -> None:
    """Copy tensors into `module` (possibly on the meta device) one by one, strictly.

    Every parameter and buffer of the module must be provided with exactly its shape;
    unexpected keys are errors. Each tensor is cast to `dtype` (floating tensors only, but for
    the keys in `exact`, which keep their own) and moved to `device` as it is assigned, so peak
    host memory is one tensor.
    """
    expected = dict(module.named_parameters())
    expected.update(dict(module.named_buffers()))
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    seen: set[str] = set()
    for key, value in items:
        if key not in expected:
            raise CheckpointError(f"{source}: unexpected tensor {key!r} {tuple(value.shape)}")
        target = expected[key]
        if tuple(value.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {key!r} has shape {tuple(value.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        cast = value.is_floating_point() and key not in exact
        new = to_device(value, dtype if cast else value.dtype, device)
        _set_tensor(module, key, new, is_param=isinstance(target, nn.Parameter))
        seen.add(key)
    missing = sorted(set(expected) - seen)
    if missing:
        shown = ", ".join(f"{k} {tuple(expected[k].shape)}" for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{source}: missing tensors {shown}{more} (truncated checkpoint?)")


def to_device(value: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`value` as `dtype` on `device`. From the host to a GPU with a dtype change, the copy goes
    as stored and the cast runs on the device: torch's blocking copy would cast on the host
    first (the released float32 DiT: 74 GB through one cast on the CPU). The same values."""
    if value.device.type == "cpu" and torch.device(device).type != "cpu" and value.dtype != dtype:
        return value.to(device=device).to(dtype)
    return value.to(device=device, dtype=dtype)


def _set_tensor(module: nn.Module, key: str, value: torch.Tensor, is_param: bool) -> None:
    *path, name = key.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    if is_param:
        owner._parameters[name] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[name] = value
