"""pyproject.toml installs what the tree holds: every package, and the web page's files."""
from __future__ import annotations

import fnmatch
import tomllib

from support import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PROJECT["tool"]["setuptools"]
NOT_INSTALLED = {"tests", "benchmarks"}  # importable from a checkout only


def test_every_package_of_the_tree_is_installed():
    includes = SETUPTOOLS["packages"]["find"]["include"]
    packages = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()} - NOT_INSTALLED
    missing = sorted(p for p in packages if not any(fnmatch.fnmatchcase(p, inc) for inc in includes))
    assert not missing, f"packages.find.include leaves out {missing}"
    assert {"camera", "protocol", "media", "model", "deployments", "client", "web"} <= packages


def test_the_web_page_files_are_package_data():
    patterns = SETUPTOOLS["package-data"]["web"]
    files = [p.name for p in (REPO / "web").iterdir() if p.is_file() and p.suffix != ".py"]
    assert "index.html" in files
    left_out = [f for f in files if not any(fnmatch.fnmatchcase(f, pat) for pat in patterns)]
    assert not left_out, f"package-data of `web` leaves out {left_out}"
