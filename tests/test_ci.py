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
