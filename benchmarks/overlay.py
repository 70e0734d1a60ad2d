"""A benchmark's serve config as an overlay of a shipped one: only what differs is written down.

An overlay file names its `base` (a serve config, relative to the repository root: a shipped
one, or another overlay that resolves to one) and the application `args` it changes, merged key
by key into the base's first application; and, optionally, `config`: changes to the serve
config outside the args (e.g. `http_options`), merged key by key into the whole config:

    base: serve_config.gpu.yaml
    config:
      http_options: {host: 127.0.0.1}
    args:
      model: {checkpoint: null, random_weights: true}

A merge replaces lists and scalars and never deletes a key: an overlay that needs a base's
setting back at its default writes the default.

`python -m benchmarks.overlay OVERLAY [OUT]` writes the resolved config (stdout without OUT);
`resolve(path)` returns it as a dict, and a plain serve config as it is.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def merge(base: dict, changes: dict) -> dict:
    """`base` with `changes` merged in: mappings key by key, anything else replaced."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve(path: str | Path) -> dict:
    doc = yaml.safe_load(Path(path).read_text())
    if "base" not in doc:
        return doc
    unknown = set(doc) - {"base", "config", "args"}
    if unknown:
        raise ValueError(f"{path}: an overlay has only `base`, `config` and `args`, not {sorted(unknown)}")
    if "applications" in (doc.get("config") or {}):
        raise ValueError(f"{path}: an overlay changes the application through `args`, not `config`")
    config = merge(resolve(REPO / doc["base"]), doc.get("config") or {})
    app = config["applications"][0]
    app["args"] = merge(app["args"], doc.get("args") or {})
    return config


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overlay")
    p.add_argument("out", nargs="?")
    a = p.parse_args(argv)
    text = yaml.safe_dump(resolve(a.overlay), sort_keys=False)
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
