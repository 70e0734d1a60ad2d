"""A world's manifest: who owns it, what made it, and what must match to continue it bit for bit.

JSON in the store (`manifest.json`) and in a `.lwf` file; read back through `Manifest.from_json`,
which checks every field's type (a hand-edited or corrupt manifest is BadWorldFile, never a
half-read world). `owner` is the principal's digest (ids.principal_dir), never a key.

The fingerprint is what a continuation must find unchanged to be byte-identical: the model as
the replicas serve it (deployments/ingress/prefix/keys.py keeps the same list for the prefix
store: every `model` field but the replicas' start-up work, the session budget that decides
full attention or the window, the attention bound, the sequence parallelism). It is kept as the
fields themselves (`model`) and their digest (`fingerprint`), so that a changed deployment can
say which field changed (`fingerprint_changes`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from deployments.config import AppArgs
from deployments.worlds.errors import BadWorldFile
from deployments.worlds.ids import check_world_id

FORMAT = 1
_NOT_OUTPUT = ("warmup", "prompt_cache_size", "compile_cache_dir")  # start-up work and caches only


def served_model(args: AppArgs) -> dict[str, Any]:
    """The fields a bit-exact continuation needs unchanged (JSON values)."""
    s = args.sessions
    return {"model": args.model.model_dump(mode="json", exclude=set(_NOT_OUTPUT)),
            "kv_budget_gib": s.kv_budget_gib, "memory_fraction": s.memory_fraction,
            "max_attention_tokens": s.max_attention_tokens, "dit_parallel": args.dit_parallel}


def digest(model: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()


def fingerprint_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted names of the fields that differ (empty: a continuation is byte-identical)."""
    out = []
    for k in sorted(set(stored) | set(current)):
        a, b = stored.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{k}.{n}" for n in fingerprint_changes(a, b)]
        elif a != b:
            out.append(k)
    return out


@dataclass(frozen=True, slots=True)
class Manifest:
    world_id: str
    owner: str  # ids.principal_dir(principal): a digest
    title: str
    model_id: str  # the preset (and checkpoint folder name), for people
    dtype: str
    attention: str
    model: dict  # served_model(): what `fingerprint` digests
    fingerprint: str
    height: int
    width: int
    seed: int
    prompt: str  # as the session opened (its updates: per chunk)
    total_latent_frames: Optional[int]
    translation_scale: Optional[float]
    intrinsics_resolution: tuple[int, int]
    created: float
    updated: float
    chunks: int  # committed chunks when this manifest was written
    bytes: int  # the world's bytes in the store when this manifest was written
    format: int = FORMAT

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> "Manifest":
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise BadWorldFile("the manifest is not JSON") from None
        if not isinstance(raw, dict) or set(raw) != {f.name for f in dataclasses.fields(Manifest)}:
            raise BadWorldFile("the manifest's fields are not a world manifest's")
        if raw["format"] != FORMAT:
            raise BadWorldFile(f"world format {raw['format']!r:.20} is not {FORMAT}")
        _typed(raw, str, "owner", "title", "model_id", "dtype", "attention", "fingerprint", "prompt")
        _typed(raw, int, "height", "width", "seed", "chunks", "bytes")
        _typed(raw, (int, float), "created", "updated")
        if not isinstance(raw["model"], dict) or digest(raw["model"]) != raw["fingerprint"]:
            raise BadWorldFile("the manifest's fingerprint does not match its model fields")
        for name, kind in (("total_latent_frames", int), ("translation_scale", (int, float))):
            if raw[name] is not None:
                _typed(raw, kind, name)
        res = raw["intrinsics_resolution"]
        if not (isinstance(res, list) and len(res) == 2 and all(type(v) is int for v in res)):
            raise BadWorldFile("intrinsics_resolution is two integers")
        if raw["chunks"] < 0 or raw["bytes"] < 0 or raw["height"] <= 0 or raw["width"] <= 0:
            raise BadWorldFile("the manifest's sizes are out of range")
        try:
            check_world_id(raw["world_id"])
        except Exception:
            raise BadWorldFile("the manifest's world id is not a world id") from None
        return Manifest(**{**raw, "intrinsics_resolution": tuple(res)})


def _typed(raw: dict, kind, *names: str) -> None:
    for name in names:
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BadWorldFile(f"the manifest's {name} has the wrong type")
