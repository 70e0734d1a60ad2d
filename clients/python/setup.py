"""Build `lingbot_world_client` from the repository's client/, protocol/, camera/ and media/.

Those folders are top-level packages of the server (`from protocol.codec import decode`). In
the client distribution they live under one import name, so that a program that has its own
`protocol` or `camera` can install it: client/ becomes `lingbot_world_client`, the others its
subpackages, and every import of one of the four is rewritten to its new name while the
files are copied into build/src (nothing else of a file changes: `rewrite`, checked by
tests/client/test_client_package.py). The repository keeps one copy of the wire contract.

Build from a checkout (`pip install ./clients/python`); an sdist is not supported.
"""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

NAME = "lingbot_world_client"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# repository package -> its name in the client distribution
PACKAGES = {"client": NAME, "protocol": f"{NAME}.protocol", "camera": f"{NAME}.camera", "media": f"{NAME}.media"}
_FROM = re.compile(r"^(\s*from\s+)(client|protocol|camera|media)\b")
_IMPORT = re.compile(r"^(\s*)import\s+(client|protocol|camera|media)\s*$")


def rewrite(source: str, where: str = "<source>") -> str:
    """`source` with its imports of the four packages renamed into `lingbot_world_client`."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            i = node.lineno - 1
            match = _FROM.match(lines[i])
            if match is None:
                raise ValueError(f"{where}:{node.lineno}: cannot rewrite {lines[i].strip()!r}")
            lines[i] = match.group(1) + PACKAGES[match.group(2)] + lines[i][match.end():]
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] in PACKAGES for a in node.names):
            i = node.lineno - 1
            match = _IMPORT.match(lines[i].rstrip("\n"))
            if match is None or node.names[0].asname:  # `import camera.poses`, `import a, camera`: unused forms
                raise ValueError(f"{where}:{node.lineno}: write `import PACKAGE` or `from ... import`: {lines[i].strip()!r}")
            parent, _, leaf = PACKAGES[match.group(2)].rpartition(".")
            new = f"import {leaf}" if not parent else f"from {parent} import {leaf}"
            lines[i] = f"{match.group(1)}{new}\n"
    return "".join(lines)


def generate(out: Path) -> list[str]:
    """Write the client distribution's sources into `out`; its package names."""
    if out.exists():
        shutil.rmtree(out)
    names = []
    for folder, name in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder)
            target = out.joinpath(*name.split("."), rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rewrite(path.read_text(encoding="utf-8"), str(path)), encoding="utf-8")
            if rel.name == "__init__.py":
                names.append(".".join([name, *rel.parent.parts]))
    return sorted(names)


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__
    from setuptools import setup

    setup(packages=generate(HERE / "build" / "src"), package_dir={"": "build/src"})
