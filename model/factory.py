"""Build each engine from a checkpoint in the released layout, or the embedded tiny model.

Each deployment loads only its own part. `checkpoint=None` selects the embedded tiny default
model (preset "tiny" only): seeded random weights built in-process (its VAE narrower than the
tiny checkpoint's: `model.tiny.EMBEDDED_VAE`) and a byte-level tokenizer made in code
(model/tiny.py), so serving needs no files at all.

`random_weights=True` (load tests of the released size without its 80 GB of files) builds the
preset's dims with seeded random weights drawn directly on the device: the DiT with the
residual-scaled init of the benchmark (`init_dit_random(..., residual_scaled=True)`), the VAE
with `init_vae_random`, the UMT5 encoder with `init_t5_random_on_device` and the byte-level
tokenizer. It is logged as a warning: such a model only makes noise.

`options` (model/accel) applies the speed transforms after loading; None or the default
`AccelOptions()` is the plain path (`AccelOptions.for_serving(device, compile, fp8)` maps the
serving flags).
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from model.accel import AccelOptions, optimize_dit, optimize_vae
from model.accel.fp8_attention import append_codes
from model.checkpoint import CheckpointLayout
from model.config import VAEConfig, preset as get_preset
from model.dit.caches import KVCacheConfig
from model.dit.loader import init_dit_random, load_dit
from model.engines import DiTEngine, TextEngine, VaeEngine
from model.t5 import TextEncoder, init_t5_random, init_t5_random_on_device
from model.tiny import EMBEDDED_SEED, EMBEDDED_VAE, tiny_tokenizer
from model.vae.footprint import CacheLayout
from model.vae.model import WanVAE, init_vae_random, load_vae

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RANDOM_SEED = 20261201  # random_weights: the same weights in every replica and run
RANDOM_WARNING = ("RANDOM WEIGHTS: this %s is NOT A REAL MODEL (preset %s, seeded random weights for load "
                  "tests); its output is noise")
_log = logging.getLogger("model.factory")


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    return DTYPES[dtype] if isinstance(dtype, str) else dtype


def _embedded(preset: str, checkpoint: str | None) -> bool:
    if checkpoint is not None:
        return False
    if preset != "tiny":
        raise ValueError(f"preset {preset!r} needs a checkpoint directory; only 'tiny' is embedded")
    return True


def _random(what: str, preset: str, checkpoint: str | None) -> None:
    if checkpoint is not None:
        raise ValueError("random_weights builds random weights: pass no checkpoint")
    _log.warning(RANDOM_WARNING, what, preset)


def load_text_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str,
                     device: str, random_weights: bool = False, int8: bool = False) -> TextEngine:
    """`int8`: the encoder's matrices stored as int8 (model/text_int8.py: half the memory)."""
    dtype = as_dtype(dtype)
    if random_weights:
        _random("text encoder", preset, checkpoint)
        return TextEngine(init_t5_random_on_device(get_preset(preset).t5, tiny_tokenizer(), dtype, device,
                                                   RANDOM_SEED, int8=int8))
    if _embedded(preset, checkpoint):
        cfg = get_preset(preset).t5
        return TextEngine(init_t5_random(cfg, tiny_tokenizer(), dtype, device, EMBEDDED_SEED, int8=int8))
    return TextEngine(TextEncoder.from_checkpoint(CheckpointLayout.discover(checkpoint), dtype, device, int8))


def load_vae_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str,
                    device: str, options: AccelOptions | None = None, random_weights: bool = False) -> VaeEngine:
    # The reference runs the VAE in float32 (spec A.7); bf16 is opt-in for speed.
    dtype = as_dtype(dtype)
    if random_weights:
        _random("VAE", preset, checkpoint)
        vae = init_vae_random(get_preset(preset).vae, dtype, device, RANDOM_SEED + 1)
    elif _embedded(preset, checkpoint):
        vae = init_vae_random(EMBEDDED_VAE, dtype, device, EMBEDDED_SEED + 1)
    else:
        vae = load_vae(CheckpointLayout.discover(checkpoint).vae_file, dtype, device)
    return VaeEngine(optimize_vae(vae, options) if options is not None and options.any else vae)


def load_dit_engine(preset: str, checkpoint: str | None, dtype: torch.dtype | str, device: str,
                    local_attn_size: int | None = None, sink_size: int | None = None,
                    shift: float = 10.0, options: AccelOptions | None = None,
                    random_weights: bool = False, kv: KVCacheConfig | None = None) -> DiTEngine:
    """`kv`: how the sessions' self-attention caches store K/V (`KVCacheConfig`, checked against
    `options` here; the default is the exact shifting cache); a code cache is written by the
    device's kernel (model/accel/fp8_attention.py `append_codes`)."""
    dtype = as_dtype(dtype)
    options = options or AccelOptions()
    kv = kv or KVCacheConfig()
    options.check_cache(kv)
    if random_weights:
        _random("DiT", preset, checkpoint)
        cfg = get_preset(preset).dit.with_window(local_attn_size, sink_size)
        dit = init_dit_random(cfg, dtype, device, RANDOM_SEED + 2, residual_scaled=True)
    elif _embedded(preset, checkpoint):
        cfg = get_preset(preset).dit.with_window(local_attn_size, sink_size)
        dit = init_dit_random(cfg, dtype, device, EMBEDDED_SEED + 2)
    else:
        dit = load_dit(CheckpointLayout.discover(checkpoint), dtype, device, local_attn_size, sink_size)
    return DiTEngine(optimize_dit(dit, options), shift=shift, skip_final_update=options.skip_final_update,
                     kv=kv, append_codes=append_codes)


def vae_cache_layout(cfg: VAEConfig, dtype: torch.dtype | str, batched: bool, host_muxer: bool) -> CacheLayout:
    """The `CacheLayout` that `CacheLayout.probe` reads from a VAE of `cfg` at `dtype`, computed
    from the architecture alone: the same probe session runs on fake tensors (shapes and dtypes,
    no arithmetic), so the full-size VAE's layout takes seconds on any CPU, bf16 instructions or
    not. `batched`: the VAE runs a chunk's frames in one call (the GPU replicas');
    `host_muxer`: the muxer's host memory counts against the budget (a CPU VAE)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        vae = WanVAE(cfg).to(as_dtype(dtype))
    with FakeTensorMode(allow_non_fake_inputs=True):  # the probe's numpy image becomes a fake tensor
        engine = VaeEngine(vae.to_empty(device="cpu").requires_grad_(False).eval())
        engine.vae.batch_frames = batched
        layout = CacheLayout.probe(engine)
    return dataclasses.replace(layout, host_muxer=host_muxer)
