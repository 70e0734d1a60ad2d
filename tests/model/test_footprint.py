"""DiTEngine.footprint: what admission counts is what a session really allocates."""
from __future__ import annotations

import numpy as np
import torch

from model.config import PRESETS
from model.engine_api import SessionFootprint
from model.engines import DiTEngine
from model.factory import load_dit_engine
from model.session import DiTSessionSpec

GIB = 1024**3


def test_held_bytes_are_the_session_tensors():
    engine = load_dit_engine("tiny", None, "float32", "cpu")
    spec = DiTSessionSpec(context=torch.zeros(5, engine.cfg.text_dim), height=64, width=112, total_latent_frames=9)
    session = engine.open(spec)
    poses = np.eye(4, dtype=np.float32)[None]
    engine.step(session, torch.zeros(20, 3, 8, 14), poses, np.array([[50, 50, 56, 32]], dtype=np.float32))
    real = session.caches.nbytes + session.noise._whole.nbytes + session.text.nbytes  # noise plan drawn at chunk 0
    need = engine.footprint(64, 112, engine.kv_frames(9), 9)
    assert need.held == real
    assert need.working > 0 and need.total == need.held + need.working
    engine.close(session)


def test_the_noise_plan_is_counted():
    """Issue 12: 720*1280 with num_frames 4093 reserved 6.9 GiB of KV plus a 0.87 GiB noise plan
    that admission did not count."""
    engine = load_dit_engine("tiny", None, "float32", "cpu")
    frames = 1023  # latent frames of num_frames 4093
    need = engine.footprint(720, 1280, frames, frames)
    kv = engine.session_bytes(720, 1280, frames)
    noise = need.held - kv - 4 * engine.cfg.text_len * engine.cfg.dim
    assert abs(kv / GIB - 6.9) < 0.2 and abs(noise / GIB - 0.878) < 0.01
    unknown_length = engine.footprint(720, 1280, 3, None)
    assert unknown_length.held == engine.session_bytes(720, 1280, 3) + 4 * engine.cfg.text_len * engine.cfg.dim


def test_released_size_footprint_matches_the_h200_measurement():
    """bf16 at 464x832, full attention, 81 frames: run 2 measured KV + cross 24.55 GiB, camera
    features 3.45 GiB and activations 0.77 GiB (docs/PERFORMANCE.md)."""
    cfg = PRESETS["lingbot-world-fast"].dit

    class Shape(DiTEngine):  # the accounting only: no weights needed
        dit = None  # no model

        def __init__(self) -> None:
            self.cfg = cfg

        @property
        def dtype(self) -> torch.dtype:
            return torch.bfloat16

    need = Shape().footprint(464, 832, 21, 21)
    assert isinstance(need, SessionFootprint)
    assert abs(need.held / GIB - 24.6) < 0.1
    assert abs(need.working / GIB - (3.45 + 0.77)) < 0.1


def test_the_issue_12_session_is_refused_by_the_default_bounds():
    """720*1280 with num_frames 4093: 3600 tokens per latent frame x 1023 frames to attend to,
    far over the default work bound (too_large), and its 7.9 GiB are over the CPU budget
    of any machine under 32 GiB of RAM (0.25 of it)."""
    from deployments.config import ModelArgs, SessionArgs

    assert 3600 * 1023 > SessionArgs().max_attention_tokens
    assert 720 * 1280 <= ModelArgs().max_output_area  # allowed by area: the other bounds refuse it
