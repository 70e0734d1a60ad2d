"""Stream: lifecycle transitions and per-incarnation keys; the session journal it carries."""
from __future__ import annotations

import numpy as np
import pytest

from deployments.ingress.journal import SessionJournal
from deployments.ingress.stream import Stream, StreamClosed, StreamState, image_digest
from deployments.wire import NoiseSnapshot, SessionOptions

SPEC = SessionOptions(session_id="s", prompt="p", image_digest="d", resolution=(32, 48), seed=42,
                      total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))
IMAGE = np.zeros((16, 16, 3), np.uint8)


def stream() -> Stream:
    return Stream(SPEC, SessionJournal(IMAGE, max_bytes=1 << 20), IMAGE)


def test_lifecycle():
    s = stream()
    assert [s.take_chunk_id() for _ in range(3)] == [0, 1, 2]
    assert s.fail() and s.state is StreamState.FAILED
    assert not s.fail()  # released once
    with pytest.raises(StreamClosed):
        s.take_chunk_id()
    assert not s.close()  # a failed stream was already released
    with pytest.raises(StreamClosed):
        s.close()
    t = stream()
    assert t.close() and t.state is StreamState.CLOSED


def test_every_incarnation_has_its_own_key():
    a, b = stream(), stream()
    assert a.key != b.key and a.key.startswith("s~") and b.key.startswith("s~")
    assert (a.dit_key, a.vae_key) == (a.key, a.key)  # one key per deployment until a rebuild


def test_image_digest_tells_images_apart():
    img = np.zeros((4, 4, 3), np.uint8)
    assert image_digest(img) == image_digest(img.copy())
    assert image_digest(img) != image_digest(img.reshape(8, 2, 3))  # same bytes, other shape
    assert image_digest(b"png") != image_digest(b"jpg")


def _chunk(y: np.ndarray, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 3, axis=0)
    return poses, np.ones((3, 4), np.float32), y, rng.standard_normal((16, 3, 4, 6)).astype(np.float32)


def test_journal_keeps_chunks_in_order_and_equal_y_once():
    j = SessionJournal(IMAGE, max_bytes=1 << 20)
    j.set_context(np.zeros((5, 64), np.float32))
    y0 = np.ones((20, 3, 4, 6), np.float32)
    y1 = np.full((20, 3, 4, 6), 2.0, np.float32)
    noise = NoiseSnapshot(np.zeros(8, np.uint8), False)
    for k, y in enumerate([y0, y1, y1.copy(), y1.copy()]):
        j.add_chunk(*_chunk(y, k), noise)
    assert j.recoverable and len(j.chunks) == 4
    assert j.chunks[3].y is j.chunks[2].y is j.chunks[1].y and j.chunks[0].y is not j.chunks[1].y
    latents = 16 * 3 * 4 * 6 * 4
    assert j.nbytes == IMAGE.nbytes + 5 * 64 * 4 + 2 * y0.nbytes + 4 * (latents + 3 * 16 * 4 + 3 * 4 * 4 + 8)
    j.decoded = 2
    assert [a is c.latents for a, c in zip(j.decoded_latents(), j.chunks)] == [True, True]


def test_a_journal_over_its_budget_drops_everything_and_is_no_longer_recoverable():
    j = SessionJournal(IMAGE, max_bytes=IMAGE.nbytes + 15_000)  # the context and one chunk fit
    j.set_context(np.zeros((5, 64), np.float32))
    j.add_chunk(*_chunk(np.ones((20, 3, 4, 6), np.float32), 0), NoiseSnapshot(np.zeros(8, np.uint8), False))
    assert j.recoverable
    j.add_chunk(*_chunk(np.zeros((20, 3, 4, 6), np.float32), 1), NoiseSnapshot(np.zeros(8, np.uint8), False))
    assert not j.recoverable and j.chunks == [] and j.image is None and j.context is None
    assert not SessionJournal(IMAGE, max_bytes=None).recoverable  # recovery off
