"""The folder tree is the architecture: which package may import which, checked on the source.

Every `import` / `from ... import` statement of every module (function bodies included) is
read with `ast`; relative imports are not used in this project and are refused. What
`import protocol` and `import camera` load is checked in a fresh interpreter.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

PACKAGES = ("camera", "protocol", "media", "model", "deployments", "client", "web", "benchmarks")
# package -> first-party packages it may import (itself always)
ALLOWED = {
    "camera": set(),
    "protocol": {"camera"},
    "media": set(),
    "model": {"camera"},
    "deployments": {"camera", "protocol", "media", "model", "web"},
    "client": {"camera", "protocol", "media"},
    "web": set(),
    # serve_load drives the server as a client; capacity sizes budgets as the replicas do (deployments.memory)
    "benchmarks": {"camera", "protocol", "media", "model", "client", "deployments"},
}
HEAVY = ("torch", "ray", "av", "scipy")
# third-party modules a package must not import at all / at module level
NEVER = {"camera": {"torch", "ray", "av"}, "protocol": set(HEAVY), "media": {"torch", "ray", "scipy"}}
NOT_AT_MODULE_LEVEL = {"camera": {"scipy"}}


def imports(tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(top-level module name, line, at module level) of every import in `tree`."""
    top_level = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level count as module level
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            out.append((node.module.split(".")[0], node.lineno, id(node) in top_level))
    return out


def sources(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no sources found for {package}/"
    return files


@pytest.mark.parametrize("package", PACKAGES)
def test_import_rules(package):
    allowed = ALLOWED[package] | {package}
    wrong = []
    for path in sources(package):
        for module, line, module_level in imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{path.relative_to(REPO)}:{line} imports {module}"
            if module in PACKAGES and module not in allowed:
                wrong.append(where)
            if module in NEVER.get(package, ()):
                wrong.append(where)
            if module_level and module in NOT_AT_MODULE_LEVEL.get(package, ()):
                wrong.append(where + " at module level")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_nested_and_module_level_imports():
    tree = ast.parse("import torch\nif True:\n    from scipy import x\ndef f():\n    import av\n")
    assert imports(tree) == [("torch", 1, True), ("scipy", 3, True), ("av", 5, False)]


def loaded_by(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())


def test_protocol_and_camera_load_no_heavy_module():
    assert loaded_by("import protocol, protocol.codec, protocol.image, protocol.schema") == []
    assert loaded_by("import camera") == []
    assert loaded_by("import camera; camera.interpolate_poses(camera.check_poses([[[1.0, 0, 0, 0], [0, 1, 0, 0], "
                     "[0, 0, 1, 0], [0, 0, 0, 1]]] * 2), [0.5])") == ["scipy"]  # where it is needed
