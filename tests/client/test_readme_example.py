"""client/README.md's synchronous example (issue 57 item 3) runs as pasted against the served
app: its code block, with the distribution's import name read as the checkout's (`client`, the
same files: clients/python/setup.py), in a fresh interpreter whose $LWF_URL names the server."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import av

from support import REPO


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "client" / "README.md").read_text(), flags=re.S)
    complete = [b for b in blocks if "c = SyncWorldClient()" in b]
    assert len(complete) == 1, "client/README.md has one complete synchronous example"
    return complete[0].replace("from lingbot_world_client import", "from client import")


def test_the_synchronous_example_runs_as_pasted(served, tmp_path):
    env = {**os.environ, "LWF_URL": served.ws,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("video (33, ") and lines[0].endswith(", 3)"), lines
    assert lines[1] == "chunks 0 9 1 12 1 1", lines
    with av.open(str(tmp_path / "dolly.mp4")) as video:
        assert sum(1 for _ in video.decode(video=0)) == 33
