"""Process-group setup and engine loading for one rank of a sequence-parallel DiT replica.

Launchers: `torchrun` (benchmarks; `init_method="env://"`), Ray actors of one Serve replica
(`deployments/replicas/sp_dit.py`; a `tcp://host:port` rendezvous chosen by rank 0) and
`torch.multiprocessing` in the tests. CUDA ranks use NCCL, CPU ranks gloo.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from model.accel import AccelOptions, optimize_dit
from model.accel.fast_block import FastDiTBlock
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.parallel.engine import SPDiTEngine
from model.parallel.ulysses import apply_ulysses

DEFAULT_TIMEOUT_S = 300.0  # a rank that stops answering fails the others' collectives after this


def rank_device(device: str) -> torch.device:
    """The rank's device: "cpu", or its GPU ("cuda" is cuda:LOCAL_RANK when every GPU of the
    node is visible, as under torchrun; a Ray actor sees only its own GPU, cuda:0)."""
    if device == "cpu":
        return torch.device("cpu")
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    index = int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.device_count() > 1 else 0
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_sp_group(
    rank: int,
    world: int,
    init_method: str,
    device: torch.device,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ProcessGroup:
    """Join the replica's process group (blocks until all `world` ranks have joined)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a group of {world}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s), **kwargs)
    return dist.group.WORLD


def load_sp_dit_engine(
    preset: str,
    checkpoint: str | None,
    dtype: torch.dtype | str,
    device: torch.device,
    group: ProcessGroup,
    local_attn_size: int | None = None,
    sink_size: int | None = None,
    options: AccelOptions | None = None,
    random_weights: bool = False,
) -> SPDiTEngine:
    """This rank's engine: the whole DiT (weights are replicated), sped up by `options`
    (model/accel) and then made sequence-parallel."""
    options = options or AccelOptions()
    base = load_dit_engine(preset, checkpoint, dtype, str(device), local_attn_size, sink_size, options=options,
                           random_weights=random_weights)
    return sp_engine(base, group, options)


def sp_engine(base: DiTEngine, group: ProcessGroup, options: AccelOptions) -> SPDiTEngine:
    """The sequence-parallel engine of a built single-device engine (its DiT changes in place;
    the sampler settings are kept). `options` are the speed transforms every rank of the
    replica runs with; they are applied again here (a no-op when `base` was built with them),
    so that all ranks compute the same way."""
    dit = optimize_dit(base.dit, options)
    if any(isinstance(b, FastDiTBlock) for b in dit.blocks) != options.fast:
        raise ValueError(f"the DiT's blocks do not match the speed options {options} of the other "
                         "ranks; build every rank's engine with the same AccelOptions")
    return SPDiTEngine(
        apply_ulysses(dit, group), shift=base.schedule.shift, timesteps=base.timesteps,
        max_attention_size=base.max_attention_size, skip_final_update=options.skip_final_update,
    )
