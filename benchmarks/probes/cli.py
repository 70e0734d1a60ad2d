"""What the engine probes' command lines share: the engine they build and where their result goes."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

import torch


def parser(doc: Optional[str]) -> argparse.ArgumentParser:
    """A probe's parser with the engine options: preset, device, dtype, size, window, sink, the
    opt-in FP8 paths (a replica's `model.fp8` / `model.fp8_attention`), --out."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="lingbot-world-fast")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--size", type=lambda s: tuple(int(x) for x in s.split("x")), default=(464, 832))
    p.add_argument("--window", type=int, default=15, help="local_attn_size (latent frames); -1: full attention")
    p.add_argument("--sink", type=int, default=3)
    p.add_argument("--fp8", action="store_true", help="FP8 GEMMs (a replica's `model.fp8`)")
    p.add_argument("--fp8-attention", action="store_true", help="FP8 self-attention and its code cache (CUDA)")
    p.add_argument("--out", type=Path, default=None)
    return p


def emit(result: dict[str, Any], out: Optional[Path]) -> int:
    """The result as JSON: to `out` when given, and on stdout."""
    text = json.dumps(result, indent=2)
    if out is not None:
        out.write_text(text + "\n")
    print(text)
    return 0
