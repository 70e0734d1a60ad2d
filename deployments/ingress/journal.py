"""SessionJournal: what the ingress keeps of one session to rebuild it on another replica.

A session's replica state (DiT KV caches, VAE causal caches, muxer) is large and lives in one
replica; what produced it is small and is kept here, beside the connection: the image and
text context, and per finished chunk the camera payload as received, its conditioning y and
its clean latents (and the text context of a prompt update made before it), plus the noise generator's state after the last chunk. When a replica dies
or drops the session, the DiT replays one cache-update call per past chunk and the VAE
replays its conditions and decodes (`DiTDeployment.restore`, `VaeDeployment.restore`); the session then
continues exactly as if nothing had happened.

Consecutive chunks' y converge to one value (zero frames through the causal encoder), so
equal y are stored once. A journal that outgrows its byte budget drops its contents: the
session can no longer be recovered and a lost replica then means `session_lost`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from deployments.wire import NoiseSnapshot, PastChunk


class SessionJournal:
    """Inputs and results of one session so far; `recoverable` while within its budget."""

    def __init__(self, image: np.ndarray, max_bytes: Optional[int]) -> None:
        """`image`: RGB uint8 [H0, W0, 3]; `max_bytes` None turns recovery off."""
        self.image: Optional[np.ndarray] = image
        self.context: Optional[np.ndarray] = None  # [L, text_dim] once the prompt is encoded
        self.chunks: list[PastChunk] = []  # sent as they are to `DiTDeployment.restore`
        self.noise: Optional[NoiseSnapshot] = None  # after the last chunk
        self.conditioned = 0  # condition calls the VAE answered (its encoder position)
        self.decoded = 0  # decode calls the VAE answered (its decoder and muxer position)
        self._max_bytes = max_bytes
        self._enabled = max_bytes is not None
        self.nbytes = image.nbytes
        if not self._enabled:
            self.image = None

    @property
    def recoverable(self) -> bool:
        return self._enabled

    def set_context(self, context: np.ndarray) -> None:
        self._keep(context.nbytes)
        if self._enabled:
            self.context = context

    def add_chunk(self, poses: np.ndarray, intrinsics: np.ndarray, y: np.ndarray, latents: np.ndarray,
                  noise: NoiseSnapshot, context: Optional[np.ndarray] = None) -> None:
        """Record a finished chunk (in chunk order); `context`: the prompt update (prompt
        steering) applied before it, replayed at the same point by a rebuild."""
        previous = self.chunks[-1].y if self.chunks else None
        if previous is not None and previous.shape == y.shape and np.array_equal(previous, y):
            y = previous
        new_bytes = poses.nbytes + intrinsics.nbytes + latents.nbytes + (0 if y is previous else y.nbytes)
        new_bytes += 0 if context is None else context.nbytes
        self._keep(new_bytes)
        if self._enabled:
            self.chunks.append(PastChunk(poses, intrinsics, y, latents, context))
            self.noise = noise

    def decoded_latents(self) -> list[np.ndarray]:
        """Latents of the chunks the VAE has decoded, in order (to rebuild its decoder)."""
        assert self.decoded <= len(self.chunks), "a chunk was decoded before the journal saw it"
        return [c.latents for c in self.chunks[: self.decoded]]

    def _keep(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self._enabled and self.nbytes > self._max_bytes:
            self._enabled = False  # over budget: free everything, the session is no longer recoverable
            self.image, self.context, self.chunks, self.noise = None, None, [], None
