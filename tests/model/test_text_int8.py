"""The text encoder's int8 weights (model/text_int8.py, `model.text_weights: int8`)."""
from __future__ import annotations

import pytest
import torch

from model.checkpoint import assign_state_dict
from model.config import preset
from model.t5 import TextEncoder, init_t5_random_on_device
from model.text_int8 import (GROUP, QMAX, Int8Embedding, Int8Linear, dequantize, groups, nbytes, quantize_rows,
                             swap_in_int8)
from model.tiny import tiny_tokenizer

PROMPT = "a red car drives along a mountain road at sunset"


@pytest.mark.parametrize("shape", [(300, 256), (5, 64), (4100, 128)])
def test_each_weight_is_within_half_a_step_of_its_group(shape):
    """Every weight is rebuilt within half a quantization step of its group (max |group| / 127),
    codes stay in [-127, 127] and each group's largest weight is hit exactly (up to float32)."""
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * torch.rand(shape[0], 1) * 3
    codes, scales = quantize_rows(w, block_rows=1024)
    assert codes.dtype == torch.int8 and codes.abs().max() <= QMAX
    assert scales.shape == (shape[0], groups(shape[1])) and groups(256) == 256 // GROUP and groups(64) == 1
    rebuilt = dequantize(codes, scales, torch.float32)
    step = scales.repeat_interleave(shape[1] // scales.shape[1], dim=1)
    assert ((rebuilt - w).abs() <= step / 2 + 1e-6 * w.abs()).all()
    grouped = w.view(shape[0], scales.shape[1], -1).abs().amax(dim=2)
    torch.testing.assert_close(grouped, scales * QMAX)


def test_the_tiny_checkpoint_loads_into_int8_modules_and_gives_a_nearby_context(tiny_ckpt):
    """The released layout loads strictly into the int8 modules (every matrix, the tied token
    table once), the encoder holds less than half its float32 bytes... and its context stays
    close to the exact one (the same tokens, within 10 % relative on these random-ish weights)."""
    exact = TextEncoder.from_checkpoint(tiny_ckpt, torch.float32)
    small = TextEncoder.from_checkpoint(tiny_ckpt, torch.float32, int8=True)
    linears = [m for m in small.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 7 * exact.model.config.num_layers
    assert isinstance(small.model.shared, Int8Embedding) and small.model.encoder.embed_tokens is small.model.shared
    assert all(m.scale.dtype == torch.float32 for m in linears)
    assert nbytes(small.model) < 0.5 * nbytes(exact.model) and small.dtype == torch.float32
    a, b = exact.encode(PROMPT), small.encode(PROMPT)
    assert a.shape == b.shape
    assert 0 < ((a - b).norm() / a.norm()).item() < 0.1


def test_int8_modules_compute_what_their_dequantized_weights_do():
    linear, emb = Int8Linear(256, 48, torch.float32), Int8Embedding(2000, 256, torch.float32)
    for m in (linear, emb):
        m.weight, m.scale = quantize_rows(torch.randn(m.weight.shape))
    x, ids = torch.randn(3, 256), torch.tensor([[0, 1999, 7]])
    torch.testing.assert_close(linear(x), x @ dequantize(linear.weight, linear.scale, torch.float32).T)
    torch.testing.assert_close(emb(ids), dequantize(emb.weight, emb.scale, torch.float32)[ids])


def test_random_int8_weights_are_drawn_into_every_matrix():
    """`init_t5_random_on_device(int8=True)` (the load tests' released-size path) fills every
    int8 matrix and scale (no empty memory left), and the encoder runs in bf16."""
    enc = init_t5_random_on_device(preset("tiny").t5, tiny_tokenizer(), torch.bfloat16, "cpu", 3, int8=True)
    mods = [m for m in enc.model.modules() if isinstance(m, (Int8Linear, Int8Embedding))]
    assert mods and all(m.scale.min() > 0 and torch.isfinite(m.scale).all() for m in mods)
    assert all(m.weight.abs().amax() == QMAX for m in mods)  # each group's largest maps to +-127
    out = enc.encode(PROMPT)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_exact_keys_keep_their_dtype_when_assigned():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 8, bias=False))
        names = swap_in_int8(model, torch.bfloat16)
    codes, scales = quantize_rows(torch.randn(8, 64))
    assign_state_dict(model, {"0.weight": codes, "0.scale": scales}, "t", torch.bfloat16, "cpu",
                      exact=frozenset({"0.scale"}))
    assert names == {"0.weight"} and model[0].scale.dtype == torch.float32 and model[0].weight.dtype == torch.int8
    assign_state_dict(model, {"0.weight": codes, "0.scale": scales}, "t", torch.bfloat16, "cpu")
    assert model[0].scale.dtype == torch.bfloat16  # without `exact`, floating tensors take the dtype
