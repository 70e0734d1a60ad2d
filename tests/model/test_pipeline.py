"""Pipeline API: streaming equals offline, sessions are independent, the embedded model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from camera import chunk_cameras, translation_scale
from model.pipeline import SessionRequest, WorldPipeline

MAX_AREA = 7300  # 16:9 -> 64x112 px, as the goldens




def stream(pipe, image, prompt, poses, intrinsics, frame_num, seed=42, declare=True):
    """A streaming client: chunk slices poses[12k:12k+12], one infer each."""
    spec = SessionRequest(image, prompt, seed, MAX_AREA,
                       num_frames=frame_num if declare else None,
                       translation_scale=translation_scale(poses, frame_num) if declare else None)
    session = pipe.open_session(spec)
    latents, frames = [], []
    for k in range((frame_num + 3) // 12):
        p, K = chunk_cameras(poses[:frame_num], intrinsics[:frame_num], k)
        out = pipe.step(session, p, K)
        latents.append(out.latents)
        frames.append(pipe.decode(session, out.latents))
    return torch.cat(latents, 1), np.concatenate(frames), session


def test_streaming_equals_offline_exactly(pipe, example):
    image, prompt, poses, intrinsics = example
    offline, _ = pipe.generate(image, prompt, poses, intrinsics, frame_num=33, max_area=MAX_AREA)
    latents, frames, _ = stream(pipe, image, prompt, poses, intrinsics, 33)
    assert latents.shape == (16, 9, 8, 14)
    assert frames.shape == (33, 64, 112, 3) and frames.dtype == np.uint8
    assert torch.equal(latents, offline.latents)
    assert np.array_equal(frames, offline.frames)


def test_undeclared_session_deviates_only_through_noise_and_scale(pipe, example):
    image, prompt, poses, intrinsics = example
    declared, _, _ = stream(pipe, image, prompt, poses, intrinsics, 21)
    undeclared, _, _ = stream(pipe, image, prompt, poses, intrinsics, 21, declare=False)
    assert undeclared.shape == declared.shape
    assert not torch.equal(undeclared, declared)  # per-chunk noise draws and scale differ (spec H)


def test_sessions_are_independent(pipe, example):
    image, prompt, poses, intrinsics = example
    alone_a, _, _ = stream(pipe, image, prompt, poses, intrinsics, 21, seed=1)
    alone_b, _, _ = stream(pipe, image, "another prompt", poses[::-1].copy(), intrinsics, 21, seed=2)
    # interleave the two sessions chunk by chunk in one pipeline
    sa = pipe.open_session(SessionRequest(image, prompt, 1, MAX_AREA, 21, translation_scale(poses, 21)))
    rev = poses[::-1].copy()
    sb = pipe.open_session(SessionRequest(image, "another prompt", 2, MAX_AREA, 21, translation_scale(rev, 21)))
    ptrs_a = {c.k.data_ptr() for c in sa.dit.caches.self_attn}
    ptrs_b = {c.k.data_ptr() for c in sb.dit.caches.self_attn}
    assert not ptrs_a & ptrs_b
    out_a, out_b = [], []
    for k in range(2):
        out_a.append(pipe.step(sa, *chunk_cameras(poses[:21], intrinsics[:21], k)).latents)
        out_b.append(pipe.step(sb, *chunk_cameras(rev[:21], intrinsics[:21], k)).latents)
    assert torch.equal(torch.cat(out_a, 1), alone_a)
    assert torch.equal(torch.cat(out_b, 1), alone_b)


def test_closed_session_refuses_steps(pipe, example):
    image, prompt, poses, intrinsics = example
    session = pipe.open_session(SessionRequest(image, prompt, num_frames=21, max_area=MAX_AREA))
    pipe.close(session)
    with pytest.raises(RuntimeError, match="closed"):
        pipe.step(session, poses[:12], intrinsics[:12])


def test_embedded_tiny_model_is_deterministic():
    a = WorldPipeline.load("tiny", None)
    b = WorldPipeline.load("tiny", None)
    for (na, pa), (nb, pb) in zip(a.dit.dit.state_dict().items(), b.dit.dit.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert torch.equal(a.text.encode("hello"), b.text.encode("hello"))
    with pytest.raises(ValueError, match="needs a checkpoint"):
        WorldPipeline.load("lingbot-world-fast", None)


def test_embedded_vae_is_the_narrow_one_and_the_checkpoint_keeps_its_width(pipe):
    """The embedded model's VAE is the same architecture at EMBEDDED_VAE's width (its CPU chunk
    time is nearly all VAE); the tiny checkpoint of the goldens loads at its own width (16)."""
    from model.tiny import EMBEDDED_VAE

    embedded = WorldPipeline.load("tiny", None).vae.vae
    assert embedded.encoder.conv1.weight.shape[0] == EMBEDDED_VAE.dim < pipe.vae.vae.encoder.conv1.weight.shape[0]
    assert pipe.vae.vae.encoder.conv1.weight.shape[0] == 16
    assert [n for n, _ in embedded.named_parameters()] == [n for n, _ in pipe.vae.vae.named_parameters()]
