"""How fast the DiT's weights load from the released layout (issue 35.1: >= 5 GB/s).

    python -m benchmarks.load_weights --out $OUT/load_weights.json            # on the GPU machine
    python -m benchmarks.load_weights --preset tiny --device cpu --out /tmp/lw.json

1. writes a random checkpoint of the preset's DiT in the released layout (spec A.8:
   `lingbot_world_fast/config.json`, `diffusion_pytorch_model.safetensors.index.json` and 16
   shards `diffusion_pytorch_model-000NN-of-00016.safetensors`, the tensor names of the model)
   on the machine's disk (`--dir`). The release stores float32 (~74 GB); `--storage-dtype auto`
   takes float32 when the disk has room, else bfloat16 (~37 GB), else fewer blocks
   (`--num-layers`, written into config.json): the rate, not the size, is the figure;
2. drops the files from the page cache (fsync + POSIX_FADV_DONTNEED, and
   /proc/sys/vm/drop_caches where writable), so the load reads the disk;
3. times `model.dit.loader.load_dit` (the project's loader: shards read in parallel, cast on
   the device) to `--device` in bfloat16, and the rate in GB/s of file bytes;
4. `--reference` (default on): drops the cache again and loads the same files the way the
   loader did before (safetensors' reader one tensor at a time, a blocking copy that casts on
   the host), then checks that both models are equal tensor for tensor.

JSON out: the layout written (dtype, layers, shards, bytes, file system), write time, load time
and GB/s for both loaders, `equal`. The checkpoint is deleted after unless `--keep`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import torch

from model.checkpoint import (SAFETENSORS_INDEX, T5_FILE, TOKENIZER_DIR, VAE_FILE, CheckpointLayout,
                              assign_state_dict, iter_safetensors)
from model.config import DiTConfig, preset
from model.dit.loader import load_dit
from model.dit.model import CausalDiT

DIT_DIR = "lingbot_world_fast"
SHARDS = 16  # the release's (spec A.8)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DISK_MARGIN = 1.05  # of the checkpoint's bytes, plus 2 GB, left free on the disk
SEED = 35


def config_json(cfg: DiTConfig) -> dict[str, Any]:
    """The DiT's config.json as the release carries it (the keys DiTConfig.from_json reads)."""
    return {"_class_name": "WanModelFast", "control_type": "cam", "model_type": "i2v", "dim": cfg.dim,
            "ffn_dim": cfg.ffn_dim, "num_heads": cfg.num_heads, "num_layers": cfg.num_layers,
            "freq_dim": cfg.freq_dim, "in_dim": cfg.in_dim, "out_dim": cfg.out_dim, "text_len": cfg.text_len,
            "eps": cfg.eps, "local_attn_size": -1, "sink_size": 0}


def tensor_shapes(cfg: DiTConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in CausalDiT(cfg).state_dict().items()}


def checkpoint_bytes(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(itemsize * int(torch.Size(s).numel()) for s in shapes.values())


def choose_layout(cfg: DiTConfig, storage: str, num_layers: Optional[int], free: int) -> tuple[DiTConfig, str]:
    """The config and storage dtype written: as asked, or (`auto`) the largest that fits `free`."""
    if num_layers is not None:
        cfg = dataclasses.replace(cfg, num_layers=num_layers)
    fits = lambda c, d: DISK_MARGIN * checkpoint_bytes(tensor_shapes(c), DTYPES[d]) + 2e9 <= free  # noqa: E731
    if storage != "auto":
        return cfg, storage
    for dtype in ("float32", "bfloat16"):
        if fits(cfg, dtype):
            return cfg, dtype
    layers = cfg.num_layers
    while layers > 1 and not fits(dataclasses.replace(cfg, num_layers=layers), "bfloat16"):
        layers -= 1
    return dataclasses.replace(cfg, num_layers=layers), "bfloat16"


def shard_keys(shapes: dict[str, tuple[int, ...]], shards: int) -> list[list[str]]:
    """The tensors cut into `shards` runs of about equal bytes, in the model's order."""
    sizes = {k: int(torch.Size(s).numel()) for k, s in shapes.items()}
    total, out, acc = sum(sizes.values()), [[] for _ in range(shards)], 0
    for k, n in sizes.items():
        out[min(shards - 1, acc * shards // max(total, 1))].append(k)
        acc += n
    return [keys for keys in out if keys]


def drop_page_cache(files: list[Path], whole_cache: bool = True) -> str:
    """Evict `files` from the page cache; how ("drop_caches": the machine's whole page cache, where
    writable and `whole_cache`, or "fadvise": these files' pages)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not whole_cache:
        return "fadvise"
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return "drop_caches"
    except OSError:
        return "fadvise"


def file_system(path: Path) -> str:
    """The mount's file system type of `path` (from /proc/mounts; "?" where unknown)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


def write_checkpoint(root: Path, cfg: DiTConfig, dtype: torch.dtype, shards: int) -> list[Path]:
    """The DiT of `cfg` in the released layout under `root` with seeded random values; its shards."""
    shapes = tensor_shapes(cfg)
    dit_dir = root / DIT_DIR
    dit_dir.mkdir(parents=True, exist_ok=True)
    (dit_dir / "config.json").write_text(json.dumps(config_json(cfg), indent=2))
    from safetensors.torch import save_file

    largest = max(int(torch.Size(s).numel()) for s in shapes.values())
    gen = torch.Generator().manual_seed(SEED)
    pool = torch.randn(largest + 4096, generator=gen).to(dtype)  # every tensor: a slice of it at its own offset
    groups = shard_keys(shapes, shards)
    names = [f"diffusion_pytorch_model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map, files = {}, []
    for i, (name, keys) in enumerate(zip(names, groups)):
        part = {}
        for j, k in enumerate(keys):
            n = int(torch.Size(shapes[k]).numel())
            offset = (i * 7919 + j * 104729) % 4096
            part[k] = pool[offset:offset + n].reshape(shapes[k]).clone()
        save_file(part, str(dit_dir / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in keys})
        files.append(dit_dir / name)
        del part
    total = checkpoint_bytes(shapes, dtype)
    (dit_dir / SAFETENSORS_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return files


def layout_of(root: Path) -> CheckpointLayout:
    """The layout of the DiT alone (the T5, tokenizer and VAE paths are not read here)."""
    return CheckpointLayout(root, root / DIT_DIR, root / T5_FILE, root / TOKENIZER_DIR, root / VAE_FILE)


def load_reference(layout: CheckpointLayout, cfg: DiTConfig, dtype: torch.dtype, device: str) -> CausalDiT:
    """The loader before issue 35: safetensors' reader, one tensor at a time, `Tensor.to(device,
    dtype)` (a blocking copy that casts on the host)."""
    with torch.device("meta"):
        dit = CausalDiT(cfg)
    tensors = ((k, v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype))
               for k, v in iter_safetensors(layout.dit_weight_files()))
    assign_state_dict(dit, tensors, layout.dit_dir, dtype, device)
    return dit.eval()


def timed_load(fn, files: list[Path], device: str, whole_cache: bool) -> tuple[Any, float, str]:
    how = drop_page_cache(files, whole_cache)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0, how


def equal_models(a: CausalDiT, b: CausalDiT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    cfg, storage = choose_layout(preset(args.preset).dit, args.storage_dtype, args.num_layers, free)
    dtype = DTYPES[storage]
    t0 = time.perf_counter()
    files = write_checkpoint(root, cfg, dtype, args.shards)
    write_s = time.perf_counter() - t0
    nbytes = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {
        "preset": args.preset, "device": args.device, "dir": str(root), "file_system": file_system(root),
        "disk_free_before_bytes": free, "storage_dtype": storage, "num_layers": cfg.num_layers,
        "released_num_layers": preset(args.preset).dit.num_layers, "shards": len(files), "file_bytes": nbytes,
        "write_s": round(write_s, 3), "write_GBps": round(nbytes / write_s / 1e9, 3),
    }
    layout = layout_of(root)
    try:
        dit, load_s, how = timed_load(lambda: load_dit(layout, torch.bfloat16, args.device), files, args.device,
                                      args.drop_caches)
        out.update(page_cache=how, load_s=round(load_s, 3), load_GBps=round(nbytes / load_s / 1e9, 3),
                   loaded_param_bytes=sum(p.numel() * p.element_size() for p in dit.parameters()))
        if args.reference:
            ref, ref_s, _ = timed_load(lambda: load_reference(layout, dit.cfg, torch.bfloat16, args.device), files,
                                         args.device, args.drop_caches)
            out.update(reference_load_s=round(ref_s, 3), reference_GBps=round(nbytes / ref_s / 1e9, 3),
                       equal=equal_models(dit, ref))
            del ref
        del dit
    finally:
        if not args.keep:
            shutil.rmtree(root / DIT_DIR, ignore_errors=True)
    return out


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dir", default="/tmp/lwf-load-weights", help="where the checkpoint is written (the disk read)")
    p.add_argument("--storage-dtype", default="auto", choices=["auto", *DTYPES])
    p.add_argument("--num-layers", type=int, default=None, help="write fewer DiT blocks (config.json says so)")
    p.add_argument("--shards", type=int, default=SHARDS)
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the load by the previous loader and the equality check")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint written")
    p.add_argument("--fadvise-only", dest="drop_caches", action="store_false",
                   help="evict only the checkpoint's pages, never the machine's whole page cache")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
