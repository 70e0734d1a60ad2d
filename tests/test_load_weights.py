"""benchmarks/load_weights.py on the CPU: the checkpoint it writes is the released layout (the
project's loader and safetensors' reader agree on it), and its disk-size choice."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from benchmarks import load_weights
from model.checkpoint import SAFETENSORS_INDEX, CheckpointLayout
from model.config import preset
from model.dit.loader import load_dit
from model.dit.model import CausalDiT


def test_the_written_checkpoint_loads_and_both_loaders_agree(tmp_path):
    root = tmp_path / "ckpt"
    load_weights.main(["--preset", "tiny", "--device", "cpu", "--dir", str(root), "--storage-dtype", "bfloat16",
                       "--num-layers", "1", "--shards", "3", "--keep", "--fadvise-only",
                       "--out", str(tmp_path / "lw.json")])
    out = json.loads((tmp_path / "lw.json").read_text())
    assert (out["storage_dtype"], out["num_layers"], out["shards"], out["page_cache"]) == ("bfloat16", 1, 3, "fadvise")
    assert out["equal"] is True and out["load_GBps"] > 0 and out["reference_GBps"] > 0
    dit_dir = root / "lingbot_world_fast"
    files = sorted(dit_dir.glob("diffusion_pytorch_model-0000?-of-00003.safetensors"))
    assert len(files) == 3 and out["file_bytes"] == sum(f.stat().st_size for f in files)
    assert json.loads((dit_dir / "config.json").read_text())["num_layers"] == 1
    weight_map = json.loads((dit_dir / SAFETENSORS_INDEX).read_text())["weight_map"]
    cfg = preset("tiny").dit
    with torch.device("meta"):
        expected = CausalDiT(dataclasses.replace(cfg, num_layers=1))
    assert set(weight_map) == set(expected.state_dict())
    on_disk = {k: v for f in files for k, v in load_file(str(f)).items()}  # safetensors' own reader
    assert all(v.dtype == torch.bfloat16 for v in on_disk.values())
    layout = CheckpointLayout(root, dit_dir, root / "t5", root / "tok", root / "vae")
    loaded = load_dit(layout, torch.float32, "cpu").state_dict()
    assert loaded.keys() == on_disk.keys() and all(torch.equal(loaded[k], on_disk[k].float()) for k in on_disk)
    assert len({on_disk[k].flatten()[:8].float().sum().item() for k in on_disk if on_disk[k].numel() >= 8}) > 10


@pytest.mark.parametrize("free_gb, expected", [(100, ("float32", 40)), (60, ("bfloat16", 40)), (20, ("bfloat16", None))])
def test_auto_writes_the_largest_checkpoint_the_disk_holds(free_gb, expected):
    cfg = preset("lingbot-world-fast").dit
    chosen, storage = load_weights.choose_layout(cfg, "auto", None, int(free_gb * 1e9))
    assert storage == expected[0]
    written = load_weights.checkpoint_bytes(load_weights.tensor_shapes(chosen), load_weights.DTYPES[storage])
    assert written * load_weights.DISK_MARGIN + 2e9 <= free_gb * 1e9
    if expected[1] is not None:
        assert chosen.num_layers == expected[1]
    else:  # fewer blocks, as many as fit
        assert 1 <= chosen.num_layers < 40
        more = load_weights.tensor_shapes(dataclasses.replace(chosen, num_layers=chosen.num_layers + 1))
        assert load_weights.checkpoint_bytes(more, torch.bfloat16) * load_weights.DISK_MARGIN + 2e9 > free_gb * 1e9
