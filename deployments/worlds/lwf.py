"""A world as one `.lwf` file: export, and an import that loads all of it or nothing.

Layout (little-endian):
    b"LWFWORLD" | version u32 | header length u32 | sha256 of the header (32 bytes)
    header: JSON {"manifest": {...}, "parts": [[name, size, sha256], ...]}
    the parts' bytes, one after another in the header's order, and nothing after them
The parts are the world's objects as the store keeps them (`image.npy`, `context.npy`,
`c/<k>/...`: chunks.py), re-encoded from the loaded (checked) world, so an exported file
carries only committed chunks.

An import reads at most `max_bytes` (the header's sizes are summed and refused before the body
is read), checks the header's digest, every part's name (only the names a world has), size and
sha256, that nothing follows the last part, then parses the whole world in memory (every
chunk's commit record against its parts) before it writes a byte. The world is then written
under a new id, owned by the importer (its digest), quota checked first, manifest last; a write
that fails removes what was written. So a corrupt, truncated or oversized file is BadWorldFile
and leaves nothing in the store.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import replace
from typing import BinaryIO

from deployments.worlds.chunks import COMMIT, chunk_dir, chunk_from_parts, chunk_parts, encode_array, read_commit
from deployments.worlds.errors import BadWorldFile
from deployments.worlds.ids import new_world_id, principal_dir
from deployments.worlds.manifest import Manifest
from deployments.worlds.worlds import CONTEXT, IMAGE, Worlds

MAGIC = b"LWFWORLD"
VERSION = 1
PREAMBLE = struct.Struct("<8sII32s")
MAX_HEADER = 16 << 20
CHUNK_PART = re.compile(r"c/\d{6}/(?:(?:poses|intrinsics|y|latents|context|kv_growth|noise)\.npy"
                        r"|video\.mp4|chunk\.json)")


def export_world(worlds: Worlds, principal: str, world_id: str, out: BinaryIO) -> int:
    """Write the principal's world to `out` as one `.lwf` file; returns the bytes written."""
    world = worlds.load(principal, world_id)
    parts = {IMAGE: encode_array(world.image)}
    if world.context is not None:
        parts[CONTEXT] = encode_array(world.context)
    previous = None
    for record in world.chunks:
        parts.update({f"{chunk_dir(record.index)}/{n}": d for n, d in chunk_parts(record, previous).items()})
        previous = record.past.y
    manifest = json.loads(replace(world.manifest, chunks=len(world.chunks)).to_json())
    header = json.dumps({"manifest": manifest,
                         "parts": [[n, len(d), hashlib.sha256(d).hexdigest()] for n, d in parts.items()]}).encode()
    out.write(PREAMBLE.pack(MAGIC, VERSION, len(header), hashlib.sha256(header).digest()))
    out.write(header)
    for d in parts.values():
        out.write(d)
    return PREAMBLE.size + len(header) + sum(len(d) for d in parts.values())


def _read(src: BinaryIO, n: int, what: str) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise BadWorldFile(f"the file ends inside {what}: truncated")
    return data


def read_lwf(src: BinaryIO, max_bytes: int) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest and the parts of a `.lwf` file, every check passed (BadWorldFile otherwise)."""
    magic, version, header_len, header_sha = PREAMBLE.unpack(_read(src, PREAMBLE.size, "the preamble"))
    if magic != MAGIC:
        raise BadWorldFile("not a .lwf world file")
    if version != VERSION:
        raise BadWorldFile(f".lwf version {version} is not {VERSION}")
    if header_len > min(MAX_HEADER, max_bytes):
        raise BadWorldFile("the header is over its limit")
    header = _read(src, header_len, "the header")
    if hashlib.sha256(header).digest() != header_sha:
        raise BadWorldFile("the header does not match its checksum")
    try:
        h = json.loads(header)
        manifest = Manifest.from_json(json.dumps(h["manifest"]).encode())
        listed = [(str(n), int(s), str(c)) for n, s, c in h["parts"]]
    except BadWorldFile:
        raise
    except Exception:
        raise BadWorldFile("the header is not a world's") from None
    names = [n for n, _, _ in listed]
    if len(set(names)) != len(names) or IMAGE not in names or not all(
            n in (IMAGE, CONTEXT) or CHUNK_PART.fullmatch(n) for n in names) or any(s < 0 for _, s, _ in listed):
        raise BadWorldFile("the file's parts are not a world's")
    if PREAMBLE.size + header_len + sum(s for _, s, _ in listed) > max_bytes:
        raise BadWorldFile(f"the world is over the import limit of {max_bytes} bytes")
    parts = {}
    for name, size, checksum in listed:
        data = _read(src, size, f"part {name}")
        if hashlib.sha256(data).hexdigest() != checksum:
            raise BadWorldFile(f"part {name} does not match its checksum")
        parts[name] = data
    if src.read(1):
        raise BadWorldFile("bytes follow the last part")
    return manifest, parts


def check_world(manifest: Manifest, parts: dict[str, bytes]) -> None:
    """Every chunk of the manifest committed and matching its record, and no other part."""
    previous, used = None, {IMAGE, CONTEXT}
    for k in range(manifest.chunks):
        meta = read_commit(parts.get(f"{chunk_dir(k)}/{COMMIT}", b""), k)
        mine = {n: parts[f"{chunk_dir(k)}/{n}"] for n in meta["parts"] if f"{chunk_dir(k)}/{n}" in parts}
        previous = chunk_from_parts(meta, mine, previous).past.y
        used |= {f"{chunk_dir(k)}/{n}" for n in [*meta["parts"], COMMIT]}
    if set(parts) - used:
        raise BadWorldFile("the file has parts of chunks its manifest does not count")


def import_world(worlds: Worlds, principal: str, src: BinaryIO, max_bytes: int) -> Manifest:
    """Load a `.lwf` file as a new world of `principal`: all of it, or nothing (BadWorldFile,
    QuotaExceeded, StoreUnavailable)."""
    manifest, parts = read_lwf(src, max_bytes)
    check_world(manifest, parts)
    now = worlds.now()
    mine = replace(manifest, world_id=new_world_id(), owner=principal_dir(principal), updated=now, bytes=0)
    return worlds.put_world(principal, mine, parts)
