"""Unpack wheels into a directory for PYTHONPATH, on a machine without pip access (stdlib only).

    python3 benchmarks/install_wheels.py .whl /tmp/site

For the H200 image whose Python lacks Ray (its Python 3.12 has torch and CUDA, not Ray nor
Serve's packages; benchmarks/fetch_wheels.sh fetches them): every `*.whl` of the folder is extracted as pip would lay
it out (`*.data/purelib` and `*.data/platlib` into the root; scripts, headers and data left
out), keeping each member's mode bits (raylet and gcs_server must stay executable), and
leaving out the parts of ray that Serve does not need (`ray/jars`, `ray/rllib`, `ray/llm`).
A second call with the same wheels does nothing (a marker file lists them).
"""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

SKIP_PREFIXES = ("ray/jars/", "ray/rllib/", "ray/llm/")
MARKER = ".installed-wheels"


def target_name(member: str) -> str | None:
    """Where a wheel member goes, relative to the site directory (None: left out)."""
    first, _, rest = member.partition("/")
    if first.endswith(".data"):
        kind, _, path = rest.partition("/")
        return path if kind in ("purelib", "platlib") and path else None
    if member.startswith(SKIP_PREFIXES):
        return None
    return member


def install(wheel: Path, site: Path) -> int:
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = target_name(info.filename)
            if name is None or info.is_dir():
                continue
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dest, mode)
            count += 1
    return count


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: install_wheels.py WHEEL_DIR SITE_DIR")
    wheels = sorted(Path(argv[0]).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {argv[0]}")
    site = Path(argv[1])
    site.mkdir(parents=True, exist_ok=True)
    listing = "\n".join(w.name for w in wheels)
    marker = site / MARKER
    if marker.exists() and marker.read_text() == listing:
        print(f"{len(wheels)} wheels already in {site}")
        return
    for w in wheels:
        print(f"{w.name}: {install(w, site)} files", flush=True)
    marker.write_text(listing)


if __name__ == "__main__":
    main(sys.argv[1:])
