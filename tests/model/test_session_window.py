"""Per-session full attention vs the rolling window (issue 15 item 1) on one windowed engine."""
from __future__ import annotations

import numpy as np
import torch

from camera.frames import CHUNK_LATENT_FRAMES
from model.dit.caches import KVCacheConfig
from model.factory import load_dit_engine
from model.session import DiTSessionSpec

H, W, CHUNKS = 32, 48, 3


def run(engine, full_attention: bool, total) -> tuple[list[torch.Tensor], object]:
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                          height=H, width=W, seed=3, total_latent_frames=total, full_attention=full_attention)
    session = engine.open(spec)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    intr = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
    out = []
    for _ in range(CHUNKS):
        y = torch.zeros(20, CHUNK_LATENT_FRAMES, H // 8, W // 8)
        out.append(engine.step(session, y, poses, intr).latents)
    return out, session


def test_a_full_attention_session_on_a_windowed_engine_equals_a_full_attention_engine():
    windowed = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=6, sink_size=3)
    full = load_dit_engine("tiny", None, "float32", "cpu")
    total = CHUNKS * CHUNK_LATENT_FRAMES
    exact, _ = run(full, False, total)
    same, s1 = run(windowed, True, total)
    rolled, s2 = run(windowed, False, total)
    assert all(torch.equal(a, b) for a, b in zip(exact, same))
    assert not torch.equal(exact[-1], rolled[-1])  # the window forgot frames by chunk 3
    assert windowed.kv_frames(total, True) == total and windowed.kv_frames(None) == 6
    assert s2.caches.nbytes < s1.caches.nbytes  # the window's memory is fixed at its 6 frames


def test_a_windowed_session_restored_on_a_windowed_engine_continues_bit_for_bit():
    """Open-ended (window) on an engine that also serves full attention: restore replays the
    window's evictions, so chunk 5 after the rebuild equals the uninterrupted chunk 5."""
    from model.session import PastChunk  # noqa: PLC0415

    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=6, sink_size=3)
    spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                          height=H, width=W, seed=3, total_latent_frames=None, full_attention=False)
    poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    intr = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
    ys = [torch.randn(20, CHUNK_LATENT_FRAMES, H // 8, W // 8, generator=torch.Generator().manual_seed(k))
          for k in range(5)]
    session, past = engine.open(spec), []
    for y in ys[:4]:
        out = engine.step(session, y, poses, intr).latents
        past.append(PastChunk(poses, intr, y, out))
    state = session.noise.state()
    expected = engine.step(session, ys[4], poses, intr).latents
    rebuilt = engine.restore(spec, past, state)
    assert torch.equal(engine.step(rebuilt, ys[4], poses, intr).latents, expected)
    assert rebuilt.caches.nbytes == session.caches.nbytes  # fixed at the window


def test_a_ring_window_gives_the_shifting_windows_latents_in_another_sum_order():
    """KVCacheConfig.ring (the GPU serving caches): the window's caches are rings, their slots
    never move, and the session's latents are the shifting window's up to the order of the
    attention's sums (float32 here); a full-attention session on the same engine is no ring."""
    CHUNKS_RING = 4  # a window of 9 latent frames with a sink of 3 rolls at the fourth chunk

    def session_run(ring: bool):
        engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=9, sink_size=3,
                                 kv=KVCacheConfig(ring=ring))
        assert engine.kv.ring is ring
        spec = DiTSessionSpec(context=torch.randn(8, engine.cfg.text_dim, generator=torch.Generator().manual_seed(1)),
                              height=H, width=W, seed=3)
        session = engine.open(spec)
        poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
        poses[:, 0, 3] = np.linspace(0, 0.4, 12)
        intr = np.tile(np.array([[40.0, 40.0, 24.0, 16.0]], dtype=np.float32), (12, 1))
        gen = torch.Generator().manual_seed(4)
        out = [engine.step(session, torch.randn(20, CHUNK_LATENT_FRAMES, H // 8, W // 8, generator=gen), poses,
                           intr).latents for _ in range(CHUNKS_RING)]
        layer = session.caches.self_attn[0]
        full = engine.open(DiTSessionSpec(context=spec.context, height=H, width=W, seed=3, full_attention=True))
        return torch.stack(out), layer, full.caches.self_attn[0]

    ring, ring_layer, ring_full = session_run(True)
    shift, shift_layer, _ = session_run(False)
    assert ring_layer.is_ring and not shift_layer.is_ring and not ring_full.is_ring
    frame = (H // 16) * (W // 16)
    sink = 3 * frame
    # after 4 chunks (frames 0-11) the ring holds the sink, then frames 9-11 where 3-5 were, then 6-8;
    # the shifting window the sink, then 6-8, then 9-11
    # (equal up to the sums' order of the calls that wrote frames 9-11)
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())  # noqa: E731
    ring_9, ring_6 = ring_layer.k[sink:sink + 3 * frame], ring_layer.k[sink + 3 * frame:sink + 6 * frame]
    shift_6, shift_9 = shift_layer.k[sink:sink + 3 * frame], shift_layer.k[sink + 3 * frame:sink + 6 * frame]
    assert close(ring_9, shift_9) and close(ring_6, shift_6) and not close(ring_9, shift_6)
    assert torch.equal(ring_layer.k[:sink], shift_layer.k[:sink])  # the sink, written before any roll
    torch.testing.assert_close(ring, shift, rtol=1e-4, atol=1e-4 * shift.abs().max().item())
