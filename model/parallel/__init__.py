"""Ulysses sequence parallelism: one DiT replica spread over N devices (see docs/PARALLEL.md)."""
from model.parallel.caches import allocate_sp_caches, shard_config, sp_cache_bytes
from model.parallel.engine import SPDiTEngine
from model.parallel.launch import init_sp_group, load_sp_dit_engine, rank_device, sp_engine
from model.parallel.sequence import SequenceShard
from model.parallel.ulysses import UlyssesDiT, UlyssesFastSelfAttention, UlyssesSelfAttention, apply_ulysses

__all__ = [
    "SPDiTEngine", "SequenceShard", "UlyssesDiT", "UlyssesFastSelfAttention", "UlyssesSelfAttention",
    "allocate_sp_caches", "apply_ulysses", "init_sp_group", "load_sp_dit_engine", "rank_device",
    "shard_config", "sp_cache_bytes", "sp_engine",
]
