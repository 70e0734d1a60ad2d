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
# What `pip install` of the package adds to a fresh venv (every file it writes, .pyc included;
# the venv's own pip and setuptools are subtracted as the bare venv's size). The core install
# is held to the bound: measured 103 MB (MB = 2**20 bytes; numpy 2.4: 68 with its
# OpenBLAS, Pillow 21, pydantic 9). PyAV, the `video` extra, adds 102 MB more (its FFmpeg with
# x264, x265, SVT-AV1, dav1d; av 14 to 18 are each 100-115 MB unpacked): 205 MB with it.
# `du -sm` counts whole disk blocks: 109 and 212 MB added to the empty venv's 26 (issue 57);
# the bounds hold for both.
MAX_INSTALL_MB = 150
MAX_WITH_VIDEO_MB = 240
NEVER = {"torch", "ray", "transformers", "scipy", "tokenizers", "fastapi"}


def _names(requirements: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(s)).name.lower(): r for s in requirements}


def test_its_dependencies_are_few_and_the_servers_ranges():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    client, extras = _names(project["dependencies"]), project["optional-dependencies"]
    server = _names(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert not NEVER & client.keys()
    assert set(client) == {"numpy", "msgpack", "msgpack-numpy", "pillow", "pydantic", "websockets", "tqdm"}
    assert {k: set(_names(v)) for k, v in extras.items()} == {"video": {"av"}}  # PyAV: decoding only
    for name, req in {**client, **_names(extras["video"])}.items():
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


def _install(py: Path, target: str, venv: Path) -> float:
    """Install `target` with the venv's pip; the MB the venv grew by."""
    before = _mb(venv)
    subprocess.run([str(py), "-m", "pip", "install", "-q", target], check=True, timeout=900)
    return _mb(venv) - before


def test_a_fresh_venv_with_only_the_client_package_runs_the_readme_commands(served, tmp_path):
    """The core install (no PyAV) streams, forks, drives and compares (a page the browser plays)
    within the bound; an MP4 comparison and decoded frames name the `video` extra, and work once
    it is installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, cli = venv / "bin" / "python", venv / "bin" / "lwf-client"
    core_mb = _install(py, str(CLIENT), venv)
    assert core_mb <= MAX_INSTALL_MB, f"the client package took {core_mb:.0f} MB"
    for heavy in ("torch", "ray", "scipy", "transformers", "av", "protocol", "camera", "client", "media"):
        gone = subprocess.run([str(py), "-c", f"import {heavy}"], capture_output=True, text=True, cwd=tmp_path)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, heavy
    out = subprocess.run([str(cli), "--help"], capture_output=True, text=True, check=True).stdout
    assert "examples" in out

    def lwf(*argv: str, status: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run([str(cli), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode == status, done.stderr[-2000:]
        return done

    common = ("--url", served.ws, "--size", "32*64")
    assert "wrote o.mp4" in lwf("orbit", "--frames", "21", *common, "--out", "o.mp4", "--fork-at", "1",
                                "--branch-keys", "l:1").stdout
    assert "wrote walk.mp4" in lwf("drive", "w:1,j+w:1", *common, "--out", "walk.mp4").stdout
    refused = lwf("compare", "o.mp4", "o.branch.mp4", "-o", "side.mp4", status=2).stderr.strip()
    assert len(refused.splitlines()) == 1 and "lingbot-world-client[video]" in refused, refused
    assert "-o side.html" in refused and not (tmp_path / "side.mp4").exists()
    assert "wrote side.html" in lwf("compare", "o.mp4", "o.branch.mp4", "-o", "side.html").stdout  # no decoding
    page = (tmp_path / "side.html").read_text()
    assert page.count("<video ") == 2 and "o.branch.mp4" in page
    sync = ("import sys\n"
            "from lingbot_world_client import MissingPyAV, SessionStart, SyncWorldClient\n"
            "from lingbot_world_client.synthetic import synthetic_trajectory\n"
            "t = synthetic_trajectory('orbit', 9)\n"
            f"with SyncWorldClient({served.ws!r}) as c:\n"
            "    chunk = c.step('core', ['w'], start=SessionStart(t.image, 'a street', size='32*64'))\n"
            "    c.reset('core')\n"
            "open('chunk.mp4', 'wb').write(chunk.video)\n"
            "try:\n"
            "    print(chunk.frames.shape)\n"
            "except MissingPyAV as e:\n"
            "    print('missing:', e)\n"
            "print(sorted(m for m in ('torch', 'ray', 'scipy', 'av') if m in sys.modules))\n")
    lines = subprocess.run([str(py), "-c", sync], capture_output=True, text=True, check=True,
                           cwd=tmp_path).stdout.splitlines()
    assert lines[0].startswith("missing: decoding frames needs PyAV") and "[video]" in lines[0], lines
    assert lines[1] == "[]"

    video_mb = _install(py, f"{CLIENT}[video]", venv)
    assert core_mb + video_mb <= MAX_WITH_VIDEO_MB, f"with the video extra: {core_mb + video_mb:.0f} MB"
    assert "wrote side.mp4" in lwf("compare", "o.mp4", "o.branch.mp4", "-o", "side.mp4").stdout
    check = ("import io, av, numpy as np\n"
             "from lingbot_world_client import Chunk\n"
             "data = open('chunk.mp4', 'rb').read()\n"
             "with av.open(io.BytesIO(data), format='mp4') as f:\n"
             "    want = np.stack([x.to_ndarray(format='rgb24') for x in f.decode(video=0)])\n"
             "got = Chunk(data, reply=None).frames\n"
             "print(got.shape, bool((got == want).all()))\n")
    shown = subprocess.run([str(py), "-c", check], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert shown.strip() == "(9, 32, 48, 3) True", shown
