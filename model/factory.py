"""Build each engine from a checkpoint in the released layout, or the embedded tiny model.

Each deployment loads only its own part. `checkpoint=None` selects the embedded tiny default
model (preset "tiny" only): seeded random weights built in-process and a byte-level
tokenizer made in code (model/tiny.py), so serving needs no files at all.

`options` (model/accel) applies the speed transforms after loading; None or the default
`AccelOptions()` is the plain path (`AccelOptions.for_serving(device, compile, fp8)` maps the
serving flags).
"""
from __future__ import annotations

import torch

from model.accel import AccelOptions, optimize_dit, optimize_vae
from model.checkpoint import CheckpointLayout
from model.config import preset as get_preset
from model.dit_loader import init_dit_random, load_dit
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.t5 import TextEncoder, init_t5_random
from model.tiny import EMBEDDED_SEED, tiny_tokenizer
from model.vae import init_vae_random, load_vae

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def _embedded(preset: str, checkpoint: str | None) -> bool:
    if checkpoint is not None:
        return False
    if preset != "tiny":
        raise ValueError(f"preset {preset!r} needs a checkpoint directory; only 'tiny' is embedded")
    return True


def load_text_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str,
                     device: str) -> TextEngine:
    dtype = as_dtype(dtype)
    if _embedded(preset, checkpoint):
        cfg = get_preset(preset).t5
        return TextEngine(init_t5_random(cfg, tiny_tokenizer(), dtype, device, EMBEDDED_SEED))
    return TextEngine(TextEncoder.from_checkpoint(CheckpointLayout.discover(checkpoint), dtype, device))


def load_vae_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str,
                    device: str, options: AccelOptions | None = None) -> VaeEngine:
    # The reference runs the VAE in float32 (spec A.7); bf16 is opt-in for speed.
    dtype = as_dtype(dtype)
    if _embedded(preset, checkpoint):
        vae = init_vae_random(get_preset(preset).vae, dtype, device, EMBEDDED_SEED + 1)
    else:
        vae = load_vae(CheckpointLayout.discover(checkpoint).vae_file, dtype, device)
    return VaeEngine(optimize_vae(vae, options) if options is not None and options.any else vae)


def load_dit_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str, device: str,
                    local_attn_size: int | None = None, sink_size: int | None = None,
                    shift: float = 10.0, options: AccelOptions | None = None) -> DiTEngine:
    dtype = as_dtype(dtype)
    options = options or AccelOptions()
    if _embedded(preset, checkpoint):
        cfg = get_preset(preset).dit.with_window(local_attn_size, sink_size)
        dit = init_dit_random(cfg, dtype, device, EMBEDDED_SEED + 2)
    else:
        dit = load_dit(CheckpointLayout.discover(checkpoint), dtype, device, local_attn_size, sink_size)
    return DiTEngine(optimize_dit(dit, options), shift=shift, skip_final_update=options.skip_final_update)
