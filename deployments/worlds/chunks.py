"""A world's chunk as stored: exactly what the ingress journals of it (deployments/wire.py
PastChunk and NoiseSnapshot, deployments/ingress/journal.py), its prompt update's text and the
fMP4 bytes the client received.

Parts of chunk k, under `<world>/c/<k, 6 digits>/`: `poses.npy`, `intrinsics.npy`, `y.npy`
(absent when equal to the previous chunk's: `y_from` names the chunk that holds it, as the
journal shares one array), `latents.npy`, `noise.npy` (the generator state), and where there
is one `context.npy` (a prompt update's encoded text), `kv_growth.npy` (the FP8 growth record),
`video.mp4`. `chunk.json` is written last and lists every part with its size and sha256: a
chunk without it is not committed (a writer stopped mid-chunk), and a part that does not match
it is corrupt. Arrays are `.npy` (numpy's own format: dtype and shape exact, read with
`allow_pickle=False`).
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

from deployments.wire import NoiseSnapshot, PastChunk
from deployments.worlds.errors import BadWorldFile

COMMIT = "chunk.json"
ARRAYS = ("poses", "intrinsics", "y", "latents", "context", "kv_growth", "noise")
VIDEO = "video.mp4"


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """Chunk `index` of a world: its journal entry, the prompt update made before it, its video."""

    index: int
    past: PastChunk
    noise: NoiseSnapshot
    prompt: Optional[str] = None  # the prompt update's text (`past.context` is its encoding)
    video: Optional[bytes] = None  # the fMP4 bytes the client received (init segment included for chunk 0)


def chunk_dir(index: int) -> str:
    return f"c/{index:06d}"


def encode_array(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def decode_array(data: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception:
        raise BadWorldFile("an array part is not a .npy array") from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_parts(record: ChunkRecord, previous_y: Optional[np.ndarray]) -> dict[str, bytes]:
    """The chunk's parts, `chunk.json` last (the order to write them in)."""
    p = record.past
    arrays = {"poses": p.poses, "intrinsics": p.intrinsics, "latents": p.latents, "noise": record.noise.rng,
              "context": p.context, "kv_growth": p.kv_growth}
    same_y = previous_y is not None and (p.y is previous_y or (p.y.shape == previous_y.shape
                                                               and np.array_equal(p.y, previous_y)))
    if not same_y:
        arrays["y"] = p.y
    parts = {f"{name}.npy": encode_array(a) for name, a in arrays.items() if a is not None}
    if record.video is not None:
        parts[VIDEO] = bytes(record.video)
    meta = {"index": record.index, "y_from": "previous" if same_y else "own", "whole_drawn": record.noise.whole_drawn,
            "prompt": record.prompt, "parts": {n: {"size": len(d), "sha256": sha256(d)} for n, d in parts.items()}}
    parts[COMMIT] = json.dumps(meta, sort_keys=True).encode()
    return parts


def read_commit(data: bytes, index: int) -> dict:
    """A chunk's `chunk.json`, checked."""
    try:
        meta = json.loads(data)
        ok = (isinstance(meta, dict) and meta.get("index") == index and meta.get("y_from") in ("own", "previous")
              and isinstance(meta.get("whole_drawn"), bool) and isinstance(meta.get("parts"), dict)
              and (meta.get("prompt") is None or isinstance(meta["prompt"], str))
              and all(isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
                      for v in meta["parts"].values()))
    except (ValueError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise BadWorldFile(f"chunk {index}'s commit record is not one")
    names = set(meta["parts"])
    needed = {"poses.npy", "intrinsics.npy", "latents.npy", "noise.npy"}
    needed |= {"y.npy"} if meta["y_from"] == "own" else set()
    if not needed <= names or not names <= {f"{a}.npy" for a in ARRAYS} | {VIDEO}:
        raise BadWorldFile(f"chunk {index}'s parts are not a chunk's")
    if index == 0 and meta["y_from"] == "previous":
        raise BadWorldFile("chunk 0 has no previous y")
    return meta


def chunk_from_parts(meta: dict, parts: dict[str, bytes], previous_y: Optional[np.ndarray]) -> ChunkRecord:
    """A chunk from its checked commit record and its parts (each checked against it)."""
    for name, want in meta["parts"].items():
        data = parts.get(name)
        if data is None or len(data) != want["size"] or sha256(data) != want["sha256"]:
            raise BadWorldFile(f"chunk {meta['index']}: part {name} is missing or does not match its checksum")
    a = {name[:-4]: decode_array(parts[name]) for name in meta["parts"] if name.endswith(".npy")}
    y = a["y"] if meta["y_from"] == "own" else previous_y
    if y is None:
        raise BadWorldFile(f"chunk {meta['index']} refers to a previous y that is not there")
    past = PastChunk(a["poses"], a["intrinsics"], y, a["latents"], a.get("context"), a.get("kv_growth"))
    if a["noise"].dtype != np.uint8:
        raise BadWorldFile(f"chunk {meta['index']}: the noise state is not bytes")
    return ChunkRecord(meta["index"], past, NoiseSnapshot(a["noise"], meta["whole_drawn"]), meta["prompt"],
                       parts.get(VIDEO))
