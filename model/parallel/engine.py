"""SPDiTEngine: the DiTEngine of one rank of a sequence-parallel replica.

Every rank runs the same engine calls in the same order (rank 0 forwards each call to the
others): the sampler, noise plan and camera track are replicated and deterministic (a CPU
generator with the session's seed), and each DiT call returns the whole velocity on every
rank, so all ranks hold bit-identical latents without broadcasting them. Only the KV
caches differ per rank (H/N heads each).
"""
from __future__ import annotations

from typing import Any

from model.engines import DiTEngine
from model.parallel.caches import allocate_sp_caches, sp_cache_bytes
from model.parallel.ulysses import UlyssesDiT
from model.dit.caches import DiTCaches
from model.session import DiTSessionSpec, frame_tokens


class SPDiTEngine(DiTEngine):
    """DiTEngine over a UlyssesDiT: per-rank caches; everything else is DiTEngine's."""

    def __init__(self, dit: UlyssesDiT, **options: Any) -> None:
        """`options`: DiTEngine's (shift, timesteps, max_attention_size, skip_final_update)."""
        super().__init__(dit, **options)
        self.world = dit.world
        self.rank = dit.rank

    def session_bytes(self, spec_h: int, spec_w: int, kv_frames: int) -> int:
        """Bytes of one session's caches on ONE rank (every rank holds the same amount)."""
        return sp_cache_bytes(self.cfg, self.world, frame_tokens(spec_h, spec_w), kv_frames, self.dtype)

    def token_share(self, tokens: int) -> int:
        """The tokens of this rank's sequence shard (camera features, most activations)."""
        return -(-tokens // self.world)

    def allocate_caches(self, spec: DiTSessionSpec) -> DiTCaches:
        """This rank's caches: heads / world per layer."""
        return allocate_sp_caches(
            self.session_cfg(spec.full_attention), self.world, spec.frame_seqlen, spec.total_latent_frames, self.dtype, self.device,
            max_attention_size=self.max_attention_size,
        )
