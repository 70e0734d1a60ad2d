"""model/t5.py: tokenizer + cleaning, Wan->transformers key map, UMT5 encoder vs the goldens."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from model.checkpoint import T5_FILE, CheckpointError, CheckpointLayout, load_pth
from model.config import PRESETS
from model.t5 import (
    EOS_ID,
    TEXT_LEN,
    TextEncoder,
    clean_text,
    init_t5_random,
    load_umt5,
    t5_config_from_state_dict,
    wan_to_hf_t5_key,
)
from model.tiny import tiny_tokenizer
from support import GOLDEN_FILES, SHARED, TINY_CKPT, load_golden, rel_err

GOLDEN_NAMES = [p.name for p in GOLDEN_FILES]
TOKENIZER_DIR = TINY_CKPT / "google" / "umt5-xxl"


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_checkpoint(TINY_CKPT, torch.float32, "cpu")


def released_keys() -> dict[str, tuple[int, ...]]:
    """Names and shapes of the released encoder's tensors (docs/keys listing)."""
    text = (SHARED / "docs" / "keys" / "t5_umt5xxl_encoder_keys.txt").read_text()
    keys = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\S+) \(([\d, ]+)\)", line.strip())
        if m:
            keys[m.group(1)] = tuple(int(d) for d in m.group(2).split(",") if d.strip())
    return keys


def tiny_layout(tmp_path, sd) -> CheckpointLayout:
    torch.save(sd, tmp_path / T5_FILE)
    return CheckpointLayout(tmp_path, tmp_path, tmp_path / T5_FILE, TOKENIZER_DIR, tmp_path / "vae.pth")


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_tokenize_matches_golden(encoder, name):
    g = load_golden(name)
    ids, mask = encoder.tokenize(g["meta"]["prompt"])
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape == mask.shape == (1, TEXT_LEN)
    assert torch.equal(ids, g["t5"]["ids"])
    assert torch.equal(mask, g["t5"]["mask"])


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_encode_matches_golden(encoder, name):
    g = load_golden(name)
    ctx = encoder.encode(g["meta"]["prompt"])
    want = g["t5"]["context"]
    assert ctx.shape == want.shape == (int(g["t5"]["mask"].sum()), 64)
    assert rel_err(ctx, want) <= 1e-5  # measured ~2e-6 (transformers' UMT5 vs the reference)


def test_encode_in_bfloat16():
    enc = TextEncoder.from_checkpoint(TINY_CKPT, torch.bfloat16, "cpu")
    g = load_golden(GOLDEN_NAMES[0])
    ctx = enc.encode(g["meta"]["prompt"])
    assert ctx.dtype == torch.bfloat16
    assert rel_err(ctx.float(), g["t5"]["context"]) < 0.1  # bf16 rounding through 2 random layers: ~5e-2


def test_clean_text():
    assert clean_text("  a &amp;amp; b\n\t\u00a0c  ") == "a & b c"  # unescaped twice, spaces collapsed
    assert clean_text("sch\u00c3\u00b6n") == "sch\u00f6n"  # ftfy repairs mojibake
    assert clean_text("\n") == ""


def test_truncation_keeps_eos(encoder):
    ids, mask = encoder.tokenize("stones " * 600)
    assert mask.sum() == TEXT_LEN and ids[0, -1] == EOS_ID
    ids, mask = encoder.tokenize("")
    assert ids[0, 0] == EOS_ID and mask.sum() == 1 and (ids[0, 1:] == 0).all()
    with pytest.raises(ValueError):
        encoder.tokenize(None)


def test_key_map_round_trips_tiny_and_released_keys(encoder):
    tiny = load_pth(TINY_CKPT / T5_FILE)
    assert len(tiny) == 22
    hf_names = {n for n, _ in encoder.model.named_parameters()}
    assert {wan_to_hf_t5_key(k) for k in tiny} == hf_names
    released = released_keys()
    assert len(released) == 242
    mapped = {wan_to_hf_t5_key(k) for k in released}
    assert len(mapped) == len(released)  # one to one: no two released tensors land on one parameter
    with pytest.raises(CheckpointError):
        wan_to_hf_t5_key("blocks.0.attn.qkv.weight")


def test_released_dims_and_keys_load_on_meta():
    """The full-size encoder: dims inferred from the released shapes, every tensor assigned."""
    sd = {k: torch.empty(s, device="meta") for k, s in released_keys().items()}
    cfg = t5_config_from_state_dict(sd, "released keys")
    assert cfg == PRESETS["lingbot-world-fast"].t5
    model = load_umt5(cfg, sd, "released keys", torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == 5_680_910_336
    assert model.encoder.embed_tokens.weight is model.shared.weight
    assert model.config.relative_attention_max_distance == 128 and model.config.d_kv == 64


def test_missing_or_mismatched_tensors_raise(tmp_path):
    sd = {k: v.clone() for k, v in load_pth(TINY_CKPT / T5_FILE).items()}
    missing = dict(sd)
    del missing["blocks.1.norm2.weight"]
    with pytest.raises(CheckpointError, match="missing"):
        TextEncoder.from_checkpoint(tiny_layout(tmp_path, missing))
    wrong = dict(sd)
    wrong["blocks.1.ffn.fc1.weight"] = torch.zeros(64, 64)
    with pytest.raises(CheckpointError, match="shape"):
        TextEncoder.from_checkpoint(tiny_layout(tmp_path, wrong))
    extra = dict(sd)
    extra["blocks.0.attn.bias"] = torch.zeros(64)
    with pytest.raises(CheckpointError, match="blocks.0.attn.bias"):
        TextEncoder.from_checkpoint(tiny_layout(tmp_path, extra))
    no_dims = dict(sd)
    del no_dims["blocks.0.pos_embedding.embedding.weight"]
    with pytest.raises(CheckpointError, match="pos_embedding"):
        TextEncoder.from_checkpoint(tiny_layout(tmp_path, no_dims))


def test_init_t5_random():
    cfg = PRESETS["tiny"].t5
    a = init_t5_random(cfg, tiny_tokenizer(), seed=1)
    b = init_t5_random(cfg, tiny_tokenizer(), seed=1)
    c = init_t5_random(cfg, tiny_tokenizer(), seed=2)
    ctx = a.encode("a red fox")
    assert ctx.shape == (len(b"a red fox") + 1, cfg.dim)  # byte-level tokens + </s>
    assert torch.equal(ctx, b.encode("a red fox"))
    assert not torch.allclose(ctx, c.encode("a red fox"))
    assert torch.isfinite(ctx).all() and 0.5 < ctx.std().item() < 2  # final RMS norm with unit weight
    from_dir = init_t5_random(cfg, TOKENIZER_DIR, seed=1)
    g = load_golden(GOLDEN_NAMES[0])
    assert torch.equal(from_dir.tokenize(g["meta"]["prompt"])[0], g["t5"]["ids"])
    with pytest.raises(ValueError, match="tokenizer has"):
        init_t5_random(replace(cfg, vocab=100), TOKENIZER_DIR)


def test_random_on_device_weights_share_one_embedding_tensor(monkeypatch):
    """init_t5_random_on_device: the input embedding is the `shared` tensor, allocated once
    (before: a second copy at load, 2 GiB at the released size), seeded, and the encoder runs."""
    import torch

    from model.config import preset
    from model.t5 import init_t5_random_on_device
    from model.tiny import tiny_tokenizer

    cfg = preset("tiny").t5
    shapes, empty_like = [], torch.empty_like

    def recording(t, *args, **kwargs):
        shapes.append(tuple(t.shape))
        return empty_like(t, *args, **kwargs)

    monkeypatch.setattr(torch, "empty_like", recording)  # what Module.to_empty allocates with
    a = init_t5_random_on_device(cfg, tiny_tokenizer(), torch.float32, "cpu", 3)
    monkeypatch.undo()
    embedding = tuple(a.model.shared.weight.shape)
    assert shapes.count(embedding) == 1, shapes
    b = init_t5_random_on_device(preset("tiny").t5, tiny_tokenizer(), torch.float32, "cpu", 3)
    assert a.model.encoder.embed_tokens.weight is a.model.shared.weight
    assert torch.equal(a.model.shared.weight, b.model.shared.weight)
    assert torch.equal(a.encode("a prompt"), b.encode("a prompt"))
