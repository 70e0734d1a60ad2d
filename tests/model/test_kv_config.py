"""KVCacheConfig (model/dit/caches.py): the one place the sessions' cache form is chosen; it is
handed to the engine and its caches, never written onto the model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from model.accel import AccelOptions, optimize_dit
from model.config import PRESETS
from model.dit.caches import DiTCaches, KVCacheConfig
from model.dit.kv_codes import Fp8CodesKVCache, append_codes_reference
from model.dit.loader import init_dit_random
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.session import DiTSessionSpec


def test_it_is_validated_when_made():
    with pytest.raises(ValueError, match="format"):
        KVCacheConfig("fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ring"):
        KVCacheConfig("fp8_scaled", ring=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        KVCacheConfig().ring = True  # type: ignore[misc]


@pytest.mark.parametrize(("device", "kv_cache", "fp8_attention", "want"), [
    ("cpu", "dtype", False, KVCacheConfig("dtype", ring=False)),  # the reference's shifting window
    ("cpu", "fp8", False, KVCacheConfig("fp8_scaled", ring=False)),
    ("cuda", "dtype", False, KVCacheConfig("dtype", ring=True)),
    ("cuda", "fp8", False, KVCacheConfig("fp8_scaled", ring=False)),  # its scales keep the shift
    ("cuda", "dtype", True, KVCacheConfig("fp8_codes", ring=True)),
    ("cuda", "fp8", True, KVCacheConfig("fp8_codes", ring=True)),  # the FP8 attention's own codes win
])
def test_the_serving_choice_is_the_one_the_engine_made_before(device, kv_cache, fp8_attention, want):
    assert KVCacheConfig.for_serving(device, kv_cache, fp8_attention) == want


def test_it_is_checked_against_the_blocks_once_where_the_engine_is_built():
    with pytest.raises(ValueError, match="cudnn_fp8"):
        load_dit_engine("tiny", None, "float32", "cpu", options=AccelOptions(fast=True), kv=KVCacheConfig("fp8_codes"))


def test_nothing_is_written_onto_the_model():
    dit = init_dit_random(PRESETS["tiny"].dit, torch.float32, "cpu", 0)
    before = set(vars(dit))
    optimize_dit(dit, AccelOptions(fast=True))
    assert not {"kv_codes", "kv_ring"} & (set(vars(dit)) - before)


def test_the_engine_allocates_what_it_was_given_with_the_injected_writer():
    """The code cache writes through the function its builder hands it (on CUDA the Triton
    kernels, model/accel), never one it imports."""
    written = []

    def recording(codes, descale, new, start, rescale=None):
        written.append(start)
        return append_codes_reference(codes, descale, new, start, rescale)  # the amax: the growth record

    dit = init_dit_random(PRESETS["tiny"].dit.with_window(6, 3), torch.float32, "cpu", 0)
    engine = DiTEngine(dit, kv=KVCacheConfig("fp8_codes", ring=True), append_codes=recording)
    spec = DiTSessionSpec(context=torch.zeros(8, dit.cfg.text_dim), height=32, width=48, seed=0)
    caches = engine.allocate_caches(spec)
    layer = caches.self_attn[0]
    assert isinstance(layer, Fp8CodesKVCache) and layer.is_ring
    layer.update(torch.randn(6, layer.k.shape[1], layer.k.shape[2]), torch.randn(6, *layer.k.shape[1:]), 0)
    assert written == [0]
    plain = DiTCaches.allocate(dit.cfg, 6, None, torch.float32, "cpu")
    assert not isinstance(plain.self_attn[0], Fp8CodesKVCache) and not plain.self_attn[0].is_ring
