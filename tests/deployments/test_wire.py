"""deployments/wire.py: the messages between the ingress and the DiT are plain values."""
from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np

from deployments.wire import NoiseSnapshot, PastChunk, SessionOptions, StepResult


def test_the_wire_imports_neither_torch_nor_pydantic():
    code = "import sys, deployments.wire; print(sorted({'torch', 'pydantic'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_messages_survive_pickling_as_ray_sends_them():
    options = SessionOptions("s", "p", "d", (32, 48), 7, 6, None, (480, 832))
    step = StepResult(np.ones((16, 3, 4, 6), np.float32), NoiseSnapshot(np.arange(8, dtype=np.uint8), True),
                      {"denoise": 0.5, "previous_cache_update": 0.25}, "r")
    chunk = PastChunk(np.eye(4)[None], np.ones((1, 4)), np.zeros((20, 3, 4, 6)), step.latents)
    options2, step2, chunk2 = pickle.loads(pickle.dumps((options, step, chunk)))
    assert options2 == options and (options2.height, options2.width) == (32, 48)
    assert step2.dit_s == 0.75 and step2.noise.whole_drawn and np.array_equal(step2.latents, step.latents)
    assert chunk2.context is None and np.array_equal(chunk2.latents, chunk.latents)
