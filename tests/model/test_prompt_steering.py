"""Prompt steering (issue 15): `update_prompt` replaces only the text conditioning of a session."""
from __future__ import annotations

import pytest
import torch

from camera import chunk_cameras, translation_scale
from model.pipeline import SessionRequest
from model.session import PastChunk

MAX_AREA = 7300  # 64x112 px
NEW_PROMPT = "a snowy mountain village at night, lanterns glowing"




def _open(pipe, example, frame_num=33):
    image, prompt, poses, _ = example
    return pipe.open_session(SessionRequest(image, prompt, 42, MAX_AREA, num_frames=frame_num,
                                         translation_scale=translation_scale(poses, frame_num)))


def test_update_replaces_the_cross_cache_and_keeps_the_scene(pipe, example):
    image, prompt, poses, intrinsics = example
    session = _open(pipe, example)
    p, k = chunk_cameras(poses[:33], intrinsics[:33], 0)
    pipe.step(session, p, k)
    caches = session.dit.caches
    self_k = [c.k[: c.local_end].clone() for c in caches.self_attn]
    ends = (caches.global_end, caches.local_end)
    noise = session.dit.noise.state()
    chunk_index = session.dit.chunk_index
    pipe.update_prompt(session, NEW_PROMPT)
    # self-attention KV, position, noise stream untouched
    assert (caches.global_end, caches.local_end) == ends and session.dit.chunk_index == chunk_index
    assert all(torch.equal(a, c.k[: c.local_end]) for a, c in zip(self_k, caches.self_attn))
    assert torch.equal(session.dit.noise.state().rng, noise.rng)
    # the text embedding equals a fresh encode of the new prompt ...
    fresh = pipe.dit.dit.embed_text(pipe.text.encode(NEW_PROMPT))
    assert torch.equal(session.dit.text, fresh)
    # ... and after the next call the cross-attention cache equals a fresh session's of the new prompt
    p, k = chunk_cameras(poses[:33], intrinsics[:33], 1)
    pipe.step(session, p, k)
    other = pipe.open_session(SessionRequest(image, NEW_PROMPT, 42, MAX_AREA, num_frames=33,
                                          translation_scale=translation_scale(poses, 33)))
    p0, k0 = chunk_cameras(poses[:33], intrinsics[:33], 0)
    pipe.step(other, p0, k0)
    for a, b in zip(session.dit.caches.cross_attn, other.dit.caches.cross_attn):
        assert a.is_init and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_a_steered_stream_equals_the_offline_schedule(pipe, example):
    image, prompt, poses, intrinsics = example
    offline, _ = pipe.generate(image, prompt, poses, intrinsics, frame_num=33, max_area=MAX_AREA,
                               prompt_schedule={2: NEW_PROMPT})
    plain, _ = pipe.generate(image, prompt, poses, intrinsics, frame_num=33, max_area=MAX_AREA)
    session = _open(pipe, example)
    latents = []
    for c in range(3):
        if c == 2:
            pipe.update_prompt(session, NEW_PROMPT)
        p, k = chunk_cameras(poses[:33], intrinsics[:33], c)
        latents.append(pipe.step(session, p, k).latents)
    assert torch.equal(torch.cat(latents, 1), offline.latents)
    # chunks before the update are the unsteered ones; the steered chunk differs
    assert torch.equal(offline.latents[:, :6], plain.latents[:, :6])
    assert not torch.equal(offline.latents[:, 6:], plain.latents[:, 6:])


def test_restore_replays_a_prompt_update_bit_for_bit(pipe, example):
    image, prompt, poses, intrinsics = example
    session = _open(pipe, example, frame_num=45)
    new_context = pipe.text.encode(NEW_PROMPT)
    past, reference = [], []
    for c in range(4):
        context = None
        if c == 1:
            context = new_context
            pipe.dit.update_prompt(session.dit, context)
        y = pipe.vae.condition(session.vae)
        p, k = chunk_cameras(poses[:45], intrinsics[:45], c)
        out = pipe.dit.step(session.dit, y, p, k)
        past.append(PastChunk(p, k, y, out.latents, context))
        reference.append(out.latents)
        if c == 2:
            noise = session.dit.noise.state()
    rebuilt = pipe.dit.restore(session.dit.spec, past[:3], noise)
    assert torch.equal(rebuilt.text, session.dit.text)
    last = pipe.dit.step(rebuilt, past[3].y, past[3].poses, past[3].intrinsics).latents
    assert torch.equal(last, reference[3])


def test_schedule_cannot_steer_chunk_zero(pipe, example):
    image, prompt, poses, intrinsics = example
    with pytest.raises(ValueError):
        pipe.generate(image, prompt, poses, intrinsics, frame_num=9, max_area=MAX_AREA, prompt_schedule={0: "x"})
