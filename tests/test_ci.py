"""The test entry points fail when tests cannot run: no silent success without tests or data."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support import REPO


def test_ci_run_reports_no_tests_collected_as_a_failure(tmp_path):
    """.ci/run exits with pytest's status; 5 (no tests collected) stays 5."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "scripts" / "test.sh").write_text("exit 5\n")
    assert subprocess.run(["bash", str(tmp_path / ".ci" / "run")]).returncode == 5
    (tmp_path / "scripts" / "test.sh").write_text("exit 0\n")
    assert subprocess.run(["bash", str(tmp_path / ".ci" / "run")]).returncode == 0


def test_golden_tests_fail_without_the_shared_folder(tmp_path):
    """Without ../shared the golden-parametrized tests fail at collection instead of vanishing."""
    env = {**os.environ, "LWF_SHARED": str(tmp_path / "missing")}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/model/test_sampler.py"], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode != 0, out.stdout[-2000:]
    assert "Empty parameter set" in out.stdout + out.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 (`-m venv DIR`) and for the venv's python and pip: each call is logged.
echo "$(basename "$0") $*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" "$3/site"; cp "$0" "$3/bin/python"; cp "$0" "$3/bin/pip"; exit 0
fi
case "$*" in *sysconfig*) echo "{root}/.venv/site" ;; *MALLOC_ENV*) echo "{{}}" ;; esac
"""


def test_the_fast_tier_sets_up_once_per_pyproject_and_setup_script(tmp_path):
    """`setup.sh --if-changed` (what `test.sh --fast` runs) sets up a fresh checkout, then does
    nothing while pyproject.toml and setup.sh are unchanged, and sets up again after either
    changes; plain `setup.sh` (the full run, .ci/run) always runs every step."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    log = tmp_path / "calls.log"
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON.format(log=log, root=tmp_path))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}

    def setup(*args: str) -> list[str]:
        log.write_text("")
        subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh"), *args], env=env, check=True)
        return log.read_text().splitlines()

    first = setup("--if-changed")
    assert first[0] == "python3 -m venv .venv" and "pip install -q -e .[test]" in first
    assert (tmp_path / ".venv" / "site" / "lwf_proxy_guard.pth").is_file()
    assert setup("--if-changed") == []  # set up from these files already
    assert "pip install -q -e .[test]" in setup()  # the full run's setup: always
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = ['numpy']\n")
    assert "pip install -q -e .[test]" in setup("--if-changed")
    assert setup("--if-changed") == []
    with open(tmp_path / "scripts" / "setup.sh", "a") as f:
        f.write("# a changed setup\n")
    assert "pip install -q -e .[test]" in setup("--if-changed")
    (tmp_path / ".venv" / ".lwf-setup-stamp").unlink()  # as an interrupted setup leaves it
    assert "pip install -q -e .[test]" in setup("--if-changed")


def test_the_fast_tier_runs_the_setup_if_changed_and_the_full_run_always():
    script = (REPO / "scripts" / "test.sh").read_text()
    fast, full = script.split('if [ "$FAST" = 1 ]; then', 1)[1].split("fi\n", 1)
    assert "bash scripts/setup.sh --if-changed" in fast and "pytest" in fast
    assert "bash scripts/setup.sh\n" in full
