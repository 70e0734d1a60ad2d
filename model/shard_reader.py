"""Read safetensors shards in parallel, at the disk's speed (the DiT's loader; issue 35.1).

The released DiT is 16 shards, ~74 GB in float32. `safetensors.safe_open(...).get_tensor` reads
one tensor at a time through a memory map, holding the GIL, so the shards were read one after
the other. Here each worker thread reads whole shards in file order with `readinto` (which
releases the GIL, so several shards are read at once) into a buffer per tensor, pinned where a
GPU will receive it (its copy to the device is then a DMA at full speed). The format is
safetensors' own: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}} (and `__metadata__`), then the data. Tensors come out in no fixed order (the
loader assigns them by name); at most `max_pending` wait in host memory at a time.
"""
from __future__ import annotations

import json
import queue
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from model.checkpoint import CheckpointError

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own bound on the JSON header
_DONE = object()


def read_header(f, source: Path) -> tuple[int, dict]:
    """(data start offset, {name: entry}) of an open safetensors file."""
    raw = f.read(8)
    if len(raw) != 8:
        raise CheckpointError(f"cannot read {source}: no safetensors header")
    (size,) = struct.unpack("<Q", raw)
    if size > HEADER_LIMIT:
        raise CheckpointError(f"cannot read {source}: header of {size} bytes")
    try:
        header = json.loads(f.read(size))
    except ValueError as exc:
        raise CheckpointError(f"cannot read {source}: bad header ({exc})") from exc
    header.pop("__metadata__", None)
    return 8 + size, header


def _read_file(path: Path, out: "queue.Queue", pin: bool, stop: threading.Event) -> None:
    with open(path, "rb", buffering=0) as f:
        start, header = read_header(f, path)
        total = f.seek(0, 2)
        for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            if stop.is_set():
                return
            dtype = DTYPES.get(entry["dtype"])
            if dtype is None:
                raise CheckpointError(f"cannot read {path}: tensor {name!r} has dtype {entry['dtype']}")
            begin, end = entry["data_offsets"]
            if start + end > total:
                raise CheckpointError(f"cannot read {path}: tensor {name!r} ends past the file (truncated?)")
            buf = torch.empty(end - begin, dtype=torch.uint8, pin_memory=pin)
            f.seek(start + begin)
            view = memoryview(buf.numpy())
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise CheckpointError(f"cannot read {path}: tensor {name!r} cut short (truncated?)")
                got += n
            tensor = buf.view(dtype).reshape(entry["shape"]) if buf.numel() else torch.empty(entry["shape"], dtype=dtype)
            out.put((name, tensor))


def iter_safetensors_parallel(files: list[Path], workers: int = 4, pin: bool = False,
                              max_pending: int = 8) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, CPU tensor) of every tensor of `files`, read by `workers` threads (a
    `CheckpointError` naming the file for a short or malformed one). `pin`: page-locked buffers."""
    out: queue.Queue = queue.Queue(maxsize=max_pending)
    todo: queue.Queue = queue.Queue()
    for f in files:
        todo.put(Path(f))
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                try:
                    path = todo.get_nowait()
                except queue.Empty:
                    return
                _read_file(path, out, pin, stop)
        except CheckpointError as exc:
            out.put(exc)
        except Exception as exc:  # noqa: BLE001 - any read failure names its file
            out.put(CheckpointError(f"cannot read shard: {type(exc).__name__}: {exc}"))
        finally:
            out.put(_DONE)

    threads = [threading.Thread(target=work, name=f"lwf-shard-reader-{i}", daemon=True)
               for i in range(max(1, min(workers, len(files))))]
    for t in threads:
        t.start()
    running = len(threads)
    try:
        while running:
            item = out.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, CheckpointError):
                raise item
            else:
                yield item
    finally:
        stop.set()
        while any(t.is_alive() for t in threads):  # let blocked writers finish, then drop their items
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                pass
