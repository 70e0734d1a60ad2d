"""model/shard_reader.py: the DiT's parallel safetensors reader against safetensors' own."""
from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import SAFETENSORS_FILE, CheckpointError, CheckpointLayout
from model.shard_reader import iter_safetensors_parallel


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_ckpt):
    """The tiny DiT's tensors cut into three shards, with tensors of other dtypes mixed in."""
    tensors = load_file(str(CheckpointLayout.discover(tiny_ckpt).dit_dir / SAFETENSORS_FILE))
    g = torch.Generator().manual_seed(3)
    tensors |= {"x.bf16": torch.randn(7, 5, generator=g).bfloat16(), "x.i64": torch.arange(11),
                "x.e4m3": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn), "x.empty": torch.zeros(0, 3),
                "x.scalar": torch.tensor(2.5)}
    keys = sorted(tensors)
    root = tmp_path_factory.mktemp("shards")
    files = []
    for i in range(3):
        path = root / f"part-{i}.safetensors"
        save_file({k: tensors[k] for k in keys[i::3]}, str(path))
        files.append(path)
    return tensors, files


@pytest.mark.parametrize("workers, max_pending", [(1, 1), (3, 1), (4, 8)])
def test_every_tensor_comes_back_as_safetensors_reads_it(shards, workers, max_pending):
    tensors, files = shards
    got = dict(iter_safetensors_parallel(files, workers=workers, max_pending=max_pending))
    assert got.keys() == tensors.keys()
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k  # bytes


def test_a_truncated_shard_is_named_and_no_reader_is_left_behind(shards, tmp_path):
    _, files = shards
    cut = tmp_path / "cut.safetensors"
    data = files[1].read_bytes()
    cut.write_bytes(data[: len(data) - 100])
    before = threading.active_count()
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        list(iter_safetensors_parallel([files[0], cut, files[2]], workers=3, max_pending=1))
    with pytest.raises(CheckpointError, match="no safetensors header"):
        (tmp_path / "empty.safetensors").write_bytes(b"")
        list(iter_safetensors_parallel([tmp_path / "empty.safetensors"]))
    assert threading.active_count() == before


def test_a_consumer_that_stops_early_ends_the_readers(shards):
    _, files = shards
    before = threading.active_count()
    reader = iter_safetensors_parallel(files, workers=3, max_pending=1)
    next(reader)
    reader.close()
    assert threading.active_count() == before
