"""Keys of the prefix store (store.py): a namespace per session start and a key per chunk.

A namespace is everything that changes a session's output before its first chunk: the model
(its fingerprint: preset, weights, dtypes, attention and KV formats, window and sink, and the
session budget that decides full attention or the window), the image as sent, the prompt, the
seed, the output size, the declared options (`num_frames`, `translation_scale`,
`intrinsics_resolution`, the clip mode's raw frames) and the scope (who may reuse it). A chunk
key is its camera (the poses and intrinsics the DiT gets: explicit, or integrated from the keys
held) and its `prompt_update`. Two sessions with the same namespace and the same chunk keys up
to chunk k produce the same chunks up to k, byte for byte (the model is deterministic given
them: the noise comes from the seed). A session's path through the store is its cursor.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from deployments.config import AppArgs
from deployments.wire import SessionOptions

# Model fields that do not change a chunk's output (start-up work and caches of the replicas).
_NOT_OUTPUT = ("warmup", "prompt_cache_size")


def model_fingerprint(args: AppArgs) -> str:
    """The model as the replicas serve it: its config (checkpoint path and weights included) and
    what decides a session's attention mode (the session budget, the attention bound, the
    sequence parallelism). An ingress replica lives as long as its app's config: a changed
    config deploys a new one with an empty store."""
    s = args.sessions
    served = {"model": args.model.model_dump(mode="json", exclude=set(_NOT_OUTPUT)),
              "kv_budget_gib": s.kv_budget_gib, "memory_fraction": s.memory_fraction,
              "max_attention_tokens": s.max_attention_tokens, "dit_parallel": args.dit_parallel}
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()


def namespace(fingerprint: str, spec: SessionOptions, scope: str) -> str:
    """The store's namespace of a session opened with `spec` (its `session_id` aside) in `scope`."""
    options = asdict(spec)
    del options["session_id"], options["owner"]  # the scope says whose
    del options["offline"]  # a `/v1/videos` job's chunks are a live session's: only their turn differs
    return hashlib.sha256(json.dumps({"model": fingerprint, "scope": scope, "session": options},
                                     sort_keys=True, default=list).encode()).hexdigest()


def chunk_key(poses: np.ndarray, intrinsics: np.ndarray, prompt_update: Optional[str]) -> str:
    """A chunk's camera payload (as the DiT gets it) and its prompt update."""
    h = hashlib.sha256()
    for a in (poses, intrinsics):
        a = np.ascontiguousarray(a, dtype=np.float32)
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    h.update(b"\x00" if prompt_update is None else b"\x01" + prompt_update.encode())
    return h.hexdigest()


@dataclass(slots=True)
class PrefixCursor:
    """A session's path through the store: its namespace and its chunks' keys so far."""

    namespace: str
    keys: list[str] = field(default_factory=list)
    serving: bool = True  # every chunk so far came from the store (its replicas hold nothing yet)

    def truncated(self, chunks: int) -> PrefixCursor:
        """The cursor of the session as it was after `chunks` chunks, computing from then on
        (a rewind, a fork: the journal's replay rebuilt it on the replicas)."""
        return PrefixCursor(self.namespace, self.keys[:chunks], serving=False)
