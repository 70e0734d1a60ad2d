"""model/accel/triton_quant.py without a GPU (AccelOptions.fp8_quant="triton", opt-in).

1. Every kernel variant the wrappers launch compiles for Hopper (sm_90) ahead of time, as a
   device run would compile it first (a kernel the interpreter runs can still fail there: it
   reads globals the compiler refuses).
2. In Triton's interpreter the kernels compute the scales, the new residual and the quotients
   of the compiled-region functions they replace (`model.accel.kernels`). The quotients are
   compared unrounded (codes in float32): the interpreter does not round to e4m3 as the
   hardware's conversion does; the device run checks the e4m3 codes
   (`benchmarks.run.triton_quant_check`: 1e-6 of the codes differ on an H200).

Each mode runs in a process of its own (`triton_quant_checks.py` says why).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import REPO

CHECKS = REPO / "tests" / "model" / "triton_quant_checks.py"


@pytest.mark.parametrize("mode", ["compile", "interpret"])
def test_triton_quantization_kernels(mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(CHECKS), mode], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert f"{mode}: ok" in done.stdout
