"""The protocol package is pure: importing it (and its heavier modules) loads no torch or ray."""
from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_import_loads_no_torch_or_ray():
    code = ("import sys, protocol, protocol.codec, protocol.fmp4, protocol.image, protocol.schema; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api():
    import protocol

    for name in protocol.__all__:
        assert getattr(protocol, name) is not None
