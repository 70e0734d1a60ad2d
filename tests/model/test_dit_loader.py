"""model/dit/loader.py: the tiny checkpoint, broken copies of it, shards, random init."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import SAFETENSORS_FILE, SAFETENSORS_INDEX, CheckpointError, CheckpointLayout
from model.config import PRESETS
from model.dit.model import CausalDiT
from model.dit.loader import init_dit_random, load_dit
from model.dit.caches import DiTCaches


@pytest.fixture(scope="module")
def layout(tiny_ckpt) -> CheckpointLayout:
    return CheckpointLayout.discover(tiny_ckpt)


@pytest.fixture(scope="module")
def tiny_tensors(layout) -> dict[str, torch.Tensor]:
    return load_file(str(layout.dit_dir / SAFETENSORS_FILE))


def copy_layout(layout: CheckpointLayout, root: Path, tensors: dict | None = None) -> CheckpointLayout:
    """A layout under `root` whose DiT folder holds config.json and `tensors` (if given)."""
    dit_dir = root / "lingbot_world_fast"
    dit_dir.mkdir(parents=True)
    shutil.copy(layout.dit_dir / "config.json", dit_dir / "config.json")
    if tensors is not None:
        save_file(tensors, str(dit_dir / SAFETENSORS_FILE))
    return dataclasses.replace(layout, root=root, dit_dir=dit_dir)


def test_loads_the_tiny_checkpoint(layout, tiny_tensors):
    dit = load_dit(layout, torch.float32, "cpu")
    assert dit.cfg == PRESETS["tiny"].dit and not dit.training
    sd = dit.state_dict()
    assert sd.keys() == tiny_tensors.keys() and len(sd) == 91
    assert all(torch.equal(sd[k], v) for k, v in tiny_tensors.items())
    assert all(not p.is_meta and not p.requires_grad for p in dit.parameters())


def test_dtype_and_window_overrides(layout, tiny_tensors):
    dit = load_dit(layout, torch.bfloat16, "cpu", local_attn_size=6, sink_size=3)
    assert (dit.cfg.local_attn_size, dit.cfg.sink_size) == (6, 3)
    assert all(p.dtype == torch.bfloat16 for p in dit.parameters())
    assert torch.equal(dit.head.head.weight, tiny_tensors["head.head.weight"].bfloat16())
    with pytest.raises(CheckpointError, match="local_attn_size"):
        load_dit(layout, torch.float32, "cpu", local_attn_size=4, sink_size=3)


def test_missing_tensor_names_file_and_shape(layout, tiny_tensors, tmp_path):
    tensors = {k: v for k, v in tiny_tensors.items() if k != "blocks.1.ffn.0.weight"}
    broken = copy_layout(layout, tmp_path, tensors)
    with pytest.raises(CheckpointError) as err:
        load_dit(broken, torch.float32, "cpu")
    msg = str(err.value)
    assert SAFETENSORS_FILE in msg and "blocks.1.ffn.0.weight (256, 128)" in msg and "missing" in msg


def test_wrong_shape_names_file_and_expected_shape(layout, tiny_tensors, tmp_path):
    tensors = dict(tiny_tensors, **{"blocks.0.cam_scale_layer.weight": torch.zeros(128, 64)})
    broken = copy_layout(layout, tmp_path, tensors)
    with pytest.raises(CheckpointError) as err:
        load_dit(broken, torch.float32, "cpu")
    msg = str(err.value)
    assert SAFETENSORS_FILE in msg and "blocks.0.cam_scale_layer.weight" in msg
    assert "(128, 64)" in msg and "expected (128, 128)" in msg


def test_unexpected_tensor_is_an_error(layout, tiny_tensors, tmp_path):
    broken = copy_layout(layout, tmp_path, dict(tiny_tensors, extra=torch.zeros(3)))
    with pytest.raises(CheckpointError, match="unexpected tensor 'extra'"):
        load_dit(broken, torch.float32, "cpu")


def test_truncated_file_names_the_file(layout, tmp_path):
    broken = copy_layout(layout, tmp_path)
    data = (layout.dit_dir / SAFETENSORS_FILE).read_bytes()
    (broken.dit_dir / SAFETENSORS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=SAFETENSORS_FILE.replace(".", r"\.")):
        load_dit(broken, torch.float32, "cpu")


def test_two_shards_load_identically(layout, tiny_tensors, tmp_path):
    sharded = copy_layout(layout, tmp_path)
    keys = sorted(tiny_tensors)
    names = ["diffusion_pytorch_model-00001-of-00002.safetensors",
             "diffusion_pytorch_model-00002-of-00002.safetensors"]
    parts = (keys[: len(keys) // 2], keys[len(keys) // 2 :])
    weight_map = {}
    for name, part in zip(names, parts):
        save_file({k: tiny_tensors[k] for k in part}, str(sharded.dit_dir / name))
        weight_map.update({k: name for k in part})
    (sharded.dit_dir / SAFETENSORS_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    a = load_dit(layout, torch.float32, "cpu").state_dict()
    b = load_dit(sharded, torch.float32, "cpu").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    (sharded.dit_dir / names[1]).unlink()
    with pytest.raises(CheckpointError, match="00002-of-00002"):
        load_dit(sharded, torch.float32, "cpu")


def test_random_init_is_seeded_and_complete():
    cfg = PRESETS["tiny"].dit
    a = init_dit_random(cfg, torch.float32, "cpu", seed=1)
    b = init_dit_random(cfg, torch.float32, "cpu", seed=1)
    c = init_dit_random(cfg, torch.bfloat16, "cpu", seed=2)
    sa, sb = a.state_dict(), b.state_dict()
    with torch.device("meta"):
        assert sa.keys() == CausalDiT(cfg).state_dict().keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["blocks.0.self_attn.q.weight"], c.state_dict()["blocks.0.self_attn.q.weight"].float())
    assert c.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in c.parameters())
    assert torch.equal(sa["blocks.1.norm3.weight"], torch.ones(128))
    assert torch.equal(sa["blocks.1.self_attn.norm_k.weight"], torch.ones(128))
    assert torch.equal(sa["blocks.1.ffn.0.bias"], torch.zeros(256))
    assert 0.015 < sa["blocks.0.ffn.0.weight"].std() < 0.025
    # and it runs: one chunk of 2x2 latent frames
    caches = DiTCaches.allocate(cfg, 1, 3, torch.float32, "cpu")
    cam = a.camera_features(torch.randn(1, 384, 3, 2, 2))
    out = a(torch.randn(16, 3, 2, 2), torch.tensor([999]), torch.randn(20, 3, 2, 2),
            a.embed_text(torch.randn(5, 64)), cam, caches, 0)
    assert out.shape == (16, 3, 2, 2) and torch.isfinite(out).all()
