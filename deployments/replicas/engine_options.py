"""`ModelArgs` -> the DiT engine's options: the one place a replica's serving settings become
`load_dit_engine`'s (and a sequence-parallel rank's `load_sp_dit_engine`'s) arguments."""
from __future__ import annotations

from typing import Any, Optional

import torch

from deployments.config import ModelArgs
from model.accel import AccelOptions


def accel_options(model: ModelArgs, device: str | torch.device) -> AccelOptions:
    """The speed transforms a DiT on `device` serves with (every rank of a replica the same)."""
    return AccelOptions.for_serving(device, compile=model.compile, fp8=model.fp8,
                                    fp8_attention=model.fp8_attention, attention=model.attention)


def engine_options(model: ModelArgs, device: str | torch.device,
                   options: Optional[AccelOptions] = None) -> dict[str, Any]:
    """Keyword arguments of `load_dit_engine` / `load_sp_dit_engine` for `model` on `device`
    (`options`: the speed transforms, by default `accel_options`; a rank takes rank 0's)."""
    return {"preset": model.preset, "checkpoint": model.checkpoint, "dtype": model.dtype, "device": str(device),
            "local_attn_size": model.local_attn_size, "sink_size": model.sink_size,
            "options": options or accel_options(model, device), "random_weights": model.random_weights}
