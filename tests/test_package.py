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
    web = REPO / "web"  # its subfolders too (examples/): a pattern's folder is part of it
    files = [p.relative_to(web).as_posix() for p in web.rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert "index.html" in files and "examples/embed.html" in files
    left_out = [f for f in files if not any(fnmatch.fnmatchcase(f, pat) and f.count("/") == pat.count("/")
                                            for pat in patterns)]
    assert not left_out, f"package-data of `web` leaves out {left_out}"


def test_the_setup_venv_loads_the_proxy_guard_by_default():
    """`serve run` from the README starts Ray's proxy with the guard: scripts/setup.sh makes its
    import path the default of every Python of the venv (a serve config cannot set it)."""
    import os
    import subprocess
    import sys

    from deployments.proxy_guard import PROXY_GUARD_ENV

    [(var, value)] = PROXY_GUARD_ENV.items()
    env = {k: v for k, v in os.environ.items() if k != var}
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({var!r}))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == value
    env[var] = "mine:middlewares"  # an explicit setting wins
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({var!r}))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "mine:middlewares"
