"""model/config.py: presets, invariants and building from the released config.json."""
from __future__ import annotations

import json

import pytest

from model.checkpoint import CheckpointLayout
from model.config import PRESETS, DiTConfig, ModelConfig, preset
from support import TINY_CKPT, load_golden


def tiny_config_json() -> dict:
    return CheckpointLayout.discover(TINY_CKPT).dit_config()


def test_released_preset_dims():
    cfg = preset("lingbot-world-fast")
    d = cfg.dit
    assert (d.dim, d.ffn_dim, d.num_heads, d.num_layers, d.head_dim) == (5120, 13824, 40, 40, 128)
    assert (d.freq_dim, d.in_dim, d.out_dim, d.text_dim, d.text_len, d.patch) == (
        256, 36, 16, 4096, 512, (1, 2, 2),
    )
    assert (d.eps, d.control_dim, d.local_attn_size, d.sink_size) == (1e-6, 6, -1, 0)
    assert d.patch_features == 64
    t5 = cfg.t5
    assert (t5.vocab, t5.dim, t5.dim_attn, t5.dim_ffn, t5.num_heads, t5.num_layers, t5.num_buckets) == (
        256384, 4096, 4096, 10240, 64, 24, 32,
    )
    assert (cfg.vae.dim, cfg.vae.z_dim) == (96, 16)


def test_tiny_preset_matches_the_golden_runs():
    meta = load_golden("tiny_00.pt")["meta"]
    tiny = PRESETS["tiny"]
    dc = meta["dit_config"]
    for field in ("dim", "ffn_dim", "num_heads", "num_layers", "text_dim", "text_len", "in_dim",
                  "out_dim", "freq_dim", "eps"):
        assert getattr(tiny.dit, field) == dc[field], field
    assert tiny.dit.patch == tuple(dc["patch_size"])
    tc = meta["t5_config"]
    assert (tiny.t5.vocab, tiny.t5.dim, tiny.t5.dim_attn, tiny.t5.dim_ffn, tiny.t5.num_heads,
            tiny.t5.num_layers, tiny.t5.num_buckets) == (
        tc["vocab"], tc["dim"], tc["dim_attn"], tc["dim_ffn"], tc["num_heads"], tc["num_layers"],
        tc["num_buckets"],
    )
    assert (tiny.vae.dim, tiny.vae.z_dim) == (meta["vae_config"]["dim"], meta["vae_config"]["z_dim"])


def test_from_json_on_the_tiny_checkpoint():
    cfg = DiTConfig.from_json(tiny_config_json(), text_dim=64)
    assert cfg == PRESETS["tiny"].dit


def test_from_json_ignores_fields_the_reference_never_reads():
    raw = dict(tiny_config_json(), text_dim=4096, patch_size=[1, 4, 4], qk_norm=False)
    cfg = DiTConfig.from_json(raw, text_dim=64)
    assert cfg.text_dim == 64 and cfg.patch == (1, 2, 2)


def test_from_json_window_overrides():
    raw = tiny_config_json()
    cfg = DiTConfig.from_json(raw, text_dim=64, local_attn_size=6, sink_size=3)
    assert (cfg.local_attn_size, cfg.sink_size) == (6, 3)
    raw_windowed = dict(raw, local_attn_size=15, sink_size=3)
    assert DiTConfig.from_json(raw_windowed, text_dim=64).local_attn_size == 15
    assert DiTConfig.from_json(raw_windowed, text_dim=64, local_attn_size=-1).local_attn_size == -1


def test_from_json_vllm_omni_style_config():
    # the vllm-omni download script writes a config without control_type / window fields
    raw = json.loads(
        '{"_class_name": "WanModel", "dim": 5120, "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256,'
        ' "in_dim": 36, "model_type": "lingbot_world_fast", "num_heads": 40, "num_layers": 40,'
        ' "out_dim": 16, "text_len": 512}'
    )
    assert DiTConfig.from_json(raw, text_dim=4096) == PRESETS["lingbot-world-fast"].dit


def test_from_json_errors_are_actionable():
    with pytest.raises(ValueError, match="num_layers"):
        DiTConfig.from_json({"dim": 128, "ffn_dim": 256, "num_heads": 2}, text_dim=64)
    with pytest.raises(ValueError, match="control_type"):
        DiTConfig.from_json(dict(tiny_config_json(), control_type="joystick"), text_dim=64)
    assert DiTConfig.from_json(dict(tiny_config_json(), control_type="act"), text_dim=64).control_dim == 7


def test_window_must_hold_sink_plus_a_chunk():
    base = PRESETS["tiny"].dit
    with pytest.raises(ValueError, match="local_attn_size"):
        base.with_window(local_attn_size=5, sink_size=3)
    assert base.with_window(local_attn_size=6, sink_size=3).local_attn_size == 6
    with pytest.raises(ValueError, match="sink_size"):
        base.with_window(sink_size=-1)


def test_configs_are_frozen():
    cfg = PRESETS["tiny"].dit
    with pytest.raises(AttributeError):
        cfg.dim = 256  # type: ignore[misc]
    assert isinstance(PRESETS["tiny"], ModelConfig)
    with pytest.raises(ValueError, match="known"):
        preset("huge")
