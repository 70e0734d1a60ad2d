"""model/accel/fa4_attention.py: `attention="fa4"` wired into the fast block, checked on the CPU
against a stand-in `flash_attn.cute` that computes what FlashAttention's interface computes
([B, S, H, D] in and out, an (out, lse) pair). The real kernels need an sm_90 GPU: the `fa4`
row of benchmarks/probes/attention.py and the `compile_fa4` stage of benchmarks/run.py measure
them there."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.accel import AccelOptions, optimize_dit, transforms
from model.accel.fa4_attention import available
from model.config import DiTConfig
from model.dit.loader import init_dit_random
from model.factory import load_dit_engine
from model.session import DiTSessionSpec
from support import install_fake_fa4


@pytest.fixture
def fake_fa4(monkeypatch):
    """The stand-in kernel (`optimize_dit` told it is available); records (query tokens, key tokens)."""
    calls = install_fake_fa4(monkeypatch)
    monkeypatch.setattr(transforms, "fa4_available", lambda device: True)
    return calls


def _two_chunks(options: AccelOptions) -> tuple[torch.Tensor, int]:
    engine = load_dit_engine("tiny", None, "float32", "cpu", options=options)
    spec = DiTSessionSpec(context=torch.randn(4, engine.cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                          height=32, width=48, seed=7, total_latent_frames=6)
    session = engine.open(spec)
    poses = np.tile(np.eye(4), (12, 1, 1))
    poses[:, 0, 3] = np.linspace(0, 0.5, 12)
    latents = [engine.step(session, torch.zeros(20, 3, 4, 6), poses, np.array([[40, 40, 24, 16.0]])).latents
               for _ in range(2)]
    return torch.cat(latents, dim=1), engine.cfg.num_layers


def test_fa4_is_refused_where_it_cannot_run():
    assert not available("cpu")
    dit = init_dit_random(DiTConfig(dim=64, ffn_dim=128, num_heads=4, num_layers=1), torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="fa4"):
        optimize_dit(dit, AccelOptions(fast=True, attention="fa4"))


def test_the_fast_dit_attends_through_fa4_as_through_sdpa(fake_fa4):
    want, _ = _two_chunks(AccelOptions(fast=True, attention="cudnn", skip_final_update=True))
    assert not fake_fa4  # SDPA's path never reaches the stand-in
    got, layers = _two_chunks(AccelOptions(fast=True, attention="fa4", skip_final_update=True))
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    # 8 denoising calls, each a self- and a cross-attention per layer, and the first chunk's cache
    # update (the last chunk's is skipped), which writes K/V and stops before the last layer attends
    assert len(fake_fa4) == 8 * layers * 2 + (layers - 1) * 2
    chunk_tokens = (32 // 8) * (48 // 8) // 4 * 3
    self_calls = [c for c in fake_fa4 if c[0] == c[1] or c[1] == 2 * chunk_tokens]
    assert {n for _, n in self_calls} == {chunk_tokens, 2 * chunk_tokens}  # the second chunk reads the cache
