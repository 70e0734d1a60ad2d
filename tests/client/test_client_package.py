"""The client distribution (clients/python): one import name built from the server's own
client/, protocol/, camera/ and media/ files, few dependencies, and in a fresh venv of its
own a working `lwf-client` against the served app (issue 47)."""
from __future__ import annotations

import ast
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from support import REPO

CLIENT = REPO / "clients" / "python"
BUILD = runpy.run_path(str(CLIENT / "setup.py"), run_name="lwf_client_build")  # its functions, no setup()
NAME = BUILD["NAME"]
FIRST_PARTY = set(BUILD["PACKAGES"])
# The bound; measured: av 18 (FFmpeg with x264, x265, SVT-AV1: 104 MB) and numpy 2.4
# (73 MB) alone are 177 MB, so the fresh venv is bounded at what it takes with them.
MAX_INSTALL_MB = 240
NEVER = {"torch", "ray", "transformers", "scipy", "tokenizers", "fastapi"}


def _names(requirements: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(s)).name.lower(): r for s in requirements}


def test_its_dependencies_are_few_and_the_servers_ranges():
    client = _names(tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"])
    server = _names(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert not NEVER & client.keys()
    assert set(client) == {"numpy", "msgpack", "msgpack-numpy", "av", "pillow", "pydantic", "websockets", "tqdm"}
    for name, req in client.items():
        assert req.specifier == server[name].specifier, f"{name}: {req.specifier} vs the server's {server[name].specifier}"


@pytest.mark.parametrize("folder", sorted(FIRST_PARTY))
def test_the_build_only_renames_imports(folder):
    """Every file of the four packages goes into the distribution with its imports of them
    renamed into the one import name, and nothing else changed."""
    for path in sorted((REPO / folder).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        built = BUILD["rewrite"](source, str(path))
        changed = [(a, b) for a, b in zip(source.splitlines(), built.splitlines()) if a != b]
        assert len(source.splitlines()) == len(built.splitlines())
        assert all(a.lstrip().startswith(("from ", "import ")) and NAME in b for a, b in changed), changed
        for node in ast.walk(ast.parse(built)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            assert not {n.split(".")[0] for n in names} & FIRST_PARTY, f"{path}: {names}"


def test_an_unsupported_import_form_fails_the_build():
    with pytest.raises(ValueError, match="import PACKAGE"):
        BUILD["rewrite"]("import camera.poses\n")
    assert BUILD["rewrite"]("import camera\nfrom client.sync import X\n") == \
        f"from {NAME} import camera\nfrom {NAME}.sync import X\n"


def _mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def test_a_fresh_venv_with_only_the_client_package_runs_the_readme_commands(served, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bare_mb = _mb(venv)
    py, cli = venv / "bin" / "python", venv / "bin" / "lwf-client"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(CLIENT)], check=True, timeout=900)
    installed_mb = _mb(venv) - bare_mb
    assert installed_mb <= MAX_INSTALL_MB, f"the client package took {installed_mb:.0f} MB"
    for heavy in ("torch", "ray", "scipy", "transformers", "protocol", "camera", "client", "media"):
        gone = subprocess.run([str(py), "-c", f"import {heavy}"], capture_output=True, text=True, cwd=tmp_path)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, heavy
    out = subprocess.run([str(cli), "--help"], capture_output=True, text=True, check=True).stdout
    assert "examples" in out

    def lwf(*argv: str) -> str:
        done = subprocess.run([str(cli), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    common = ("--url", served.ws, "--size", "32*64")
    assert "wrote o.mp4" in lwf("orbit", "--frames", "21", *common, "--out", "o.mp4", "--fork-at", "1",
                                "--branch-keys", "l:1")
    assert "wrote walk.mp4" in lwf("drive", "w:1,j+w:1", *common, "--out", "walk.mp4")
    assert "wrote side.mp4" in lwf("compare", "o.mp4", "o.branch.mp4", "-o", "side.mp4")
    loaded = subprocess.run([str(py), "-c", "import sys, lingbot_world_client.cli, lingbot_world_client.sync; "
                             "print(sorted(m for m in ('torch', 'ray', 'scipy') if m in sys.modules))"],
                            capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert loaded == "[]"
