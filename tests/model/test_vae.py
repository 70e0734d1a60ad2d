"""WanVAE against the reference goldens (tiny checkpoint, CPU float32) and its streaming caches."""
from __future__ import annotations

import pytest
import torch

from model.checkpoint import CheckpointError, VAE_FILE
from model.config import VAEConfig
from model.vae.model import WanVAE, init_vae_random, load_vae
from model.vae.cache import VaeCache
from support import GOLDEN_FILES, SHARED, TINY_CKPT, load_golden, rel_err

GOLDEN_NAMES = [p.name for p in GOLDEN_FILES]
TOL = 1e-5


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    return load_vae(TINY_CKPT / VAE_FILE)


def encoder_input(g: dict) -> torch.Tensor:
    """The reference's encoder input: the image followed by F - 1 zero frames."""
    video = torch.zeros(g["vae_encode"]["input_shape"])
    video[:, 0] = g["vae_encode"]["input_first_frame"]
    return video


_whole: dict[tuple[str, str], torch.Tensor] = {}


def whole(vae: WanVAE, name: str, what: str) -> torch.Tensor:
    """Whole-video encode/decode of a golden's inputs, computed once per test session."""
    if (name, what) not in _whole:
        g = load_golden(name)
        out = vae.encode(encoder_input(g)) if what == "encode" else vae.decode(g["latents"])
        _whole[name, what] = out
    return _whole[name, what]


def test_keys_and_shapes_match_release(vae):
    listed = {}
    keys_file = SHARED / "docs" / "keys" / "wan21_vae_keys.txt"
    for line in keys_file.read_text().splitlines():
        if line and not line.startswith("#"):
            key, shape = line.split(" ", 1)
            listed[key] = shape
    sd = vae.state_dict()
    assert set(sd) == set(listed)
    # the listed shapes are the released file's (dim 96)
    with torch.device("meta"):  # shapes only
        release = WanVAE(VAEConfig(dim=96, z_dim=16))
    for key, t in release.state_dict().items():
        assert str(tuple(t.shape)) == listed[key], key


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_encode_matches_golden(vae, name):
    g = load_golden(name)
    z = whole(vae, name, "encode")
    expected = g["vae_encode"]["latent"]
    assert z.shape == expected.shape and z.dtype == torch.float32
    err = rel_err(z, expected)
    print(f"{name} encode rel_err {err:.3g} max|diff| {(z - expected).abs().max().item():.3g}")
    assert err <= TOL


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_decode_matches_golden(vae, name):
    g = load_golden(name)
    video = whole(vae, name, "decode")
    assert video.shape == g["video"].shape and video.dtype == torch.float32
    err = rel_err(video, g["video"])
    diff = (video - g["video"]).abs().max().item()
    print(f"{name} decode rel_err {err:.3g} max|diff| {diff:.3g}")
    assert err <= TOL


def test_chunked_encode_equals_whole_video_encode(vae):
    name = "tiny_03_local6_sink3.pt"  # 45 frames: 9 + 12 + 12 + 12
    g = load_golden(name)
    video = encoder_input(g)
    cache, parts, sizes = VaeCache.empty(), [], []
    for start, end in [(0, 9), (9, 21), (21, 33), (33, 45)]:
        z, cache = vae.encode_chunk(video[:, start:end], cache)
        parts.append(z)
        sizes.append(cache.nbytes)
    assert [p.shape[1] for p in parts] == [3, 3, 3, 3]
    streamed = torch.cat(parts, dim=1)
    assert torch.equal(streamed, whole(vae, name, "encode"))
    assert rel_err(streamed, g["vae_encode"]["latent"]) <= TOL
    assert sizes[1] == sizes[2] == sizes[3] > 0  # the history does not grow with the stream


def test_chunked_decode_equals_whole_video_decode(vae):
    name = "tiny_00.pt"  # 6 latent frames: 2 chunks of 3
    latents = load_golden(name)["latents"]
    cache, parts = VaeCache.empty(), []
    for k in range(2):
        x, cache = vae.decode_chunk(latents[:, 3 * k : 3 * k + 3], cache)
        parts.append(x)
    assert [p.shape[1] for p in parts] == [9, 12]
    assert torch.equal(torch.cat(parts, dim=1), whole(vae, name, "decode"))


def test_decode_one_latent_per_chunk(vae):
    name = "tiny_00.pt"
    latents = load_golden(name)["latents"]
    cache, parts = VaeCache.empty(), []
    for i in range(latents.shape[1]):
        x, cache = vae.decode_chunk(latents[:, i : i + 1], cache)
        parts.append(x)
    assert [p.shape[1] for p in parts] == [1, 4, 4, 4, 4, 4]
    assert torch.equal(torch.cat(parts, dim=1), whole(vae, name, "decode"))


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_batched_calls_reproduce_the_golden_streams(vae, name):
    """batch_frames (all frames after the first in one encoder / decoder call) computes the
    reference's per-latent-frame calls: the golden latents and video."""
    g = load_golden(name)
    try:
        vae.batch_frames = True
        z = vae.encode(encoder_input(g))
        video = vae.decode(g["latents"])
    finally:
        del vae.batch_frames  # back to the class default for the other tests
    assert rel_err(z, g["vae_encode"]["latent"]) <= TOL
    assert rel_err(video, g["video"]) <= TOL


def test_fresh_cache_per_chunk_is_not_seamless(vae):
    """The reference's per-call decode() clears the cache: 3 + 3 latents -> 9 + 9 frames."""
    name = "tiny_00.pt"
    latents = load_golden(name)["latents"]
    first = vae.decode(latents[:, :3])
    second = vae.decode(latents[:, 3:])
    assert first.shape[1] == second.shape[1] == 9  # 18 frames instead of 21
    full = whole(vae, name, "decode")
    assert torch.equal(first, full[:, :9])
    # latents 4 and 5 give 4 frames each either way, but without history they differ
    assert rel_err(second[:, 1:], full[:, 13:]) > 1e-2


def test_two_streams_are_independent():
    vae = init_vae_random(VAEConfig(dim=8, z_dim=16), torch.float32, "cpu", seed=1)
    gen = torch.Generator().manual_seed(0)
    za, zb = (torch.randn(16, 4, 2, 3, generator=gen) for _ in range(2))
    alone_a, alone_b = vae.decode(za), vae.decode(zb)
    ca, cb, parts_a, parts_b = VaeCache.empty(), VaeCache.empty(), [], []
    for k in range(2):  # interleave: a0 b0 a1 b1
        xa, ca = vae.decode_chunk(za[:, 2 * k : 2 * k + 2], ca)
        xb, cb = vae.decode_chunk(zb[:, 2 * k : 2 * k + 2], cb)
        parts_a.append(xa)
        parts_b.append(xb)
    assert torch.equal(torch.cat(parts_a, 1), alone_a)
    assert torch.equal(torch.cat(parts_b, 1), alone_b)
    assert not torch.equal(alone_a, alone_b)


def test_call_does_not_modify_the_cache_it_is_given():
    vae = init_vae_random(VAEConfig(dim=8, z_dim=16), torch.float32, "cpu", seed=2)
    video = torch.rand(3, 13, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    _, cache = vae.encode_chunk(video[:, :5], VaeCache.empty())
    snapshot = {k: v.clone() for k, v in cache.frames.items()}
    z1, next1 = vae.encode_chunk(video[:, 5:], cache)
    z2, next2 = vae.encode_chunk(video[:, 5:], cache)  # retry from the same state
    assert torch.equal(z1, z2)
    assert all(torch.equal(cache.frames[k], snapshot[k]) for k in snapshot)
    assert next1.frames.keys() == next2.frames.keys() == snapshot.keys()


def test_chunk_validation():
    vae = init_vae_random(VAEConfig(dim=8, z_dim=16), torch.float32, "cpu", seed=3)
    video = torch.zeros(3, 9, 16, 16)
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        vae.encode_chunk(video[:, :8], VaeCache.empty())
    _, enc = vae.encode_chunk(video[:, :5], VaeCache.empty())
    with pytest.raises(ValueError, match="4k frames"):
        vae.encode_chunk(video[:, :5], enc)
    with pytest.raises(ValueError, match="multiples of 8"):
        vae.encode_chunk(torch.zeros(3, 1, 12, 16), VaeCache.empty())
    with pytest.raises(ValueError, match="encoder stream"):
        vae.decode_chunk(torch.zeros(16, 1, 2, 2), enc)
    with pytest.raises(ValueError, match="size"):
        vae.encode_chunk(torch.zeros(3, 4, 16, 24), enc)
    with pytest.raises(ValueError, match=r"\[16, t>=1"):
        vae.decode_chunk(torch.zeros(4, 1, 2, 2), VaeCache.empty())


def test_load_missing_file(tmp_path):
    missing = tmp_path / VAE_FILE
    with pytest.raises(CheckpointError, match=str(missing)):
        load_vae(missing)


def test_load_wrong_shape_names_file_key_and_expected_shape(tmp_path):
    sd = torch.load(TINY_CKPT / VAE_FILE, weights_only=True)
    sd["decoder.head.2.weight"] = torch.zeros(3, 16, 3, 3, 1)
    path = tmp_path / VAE_FILE
    torch.save(sd, path)
    with pytest.raises(CheckpointError) as info:
        load_vae(path)
    msg = str(info.value)
    assert str(path) in msg and "decoder.head.2.weight" in msg and "(3, 16, 3, 3, 3)" in msg


def test_load_truncated_state_dict(tmp_path):
    sd = torch.load(TINY_CKPT / VAE_FILE, weights_only=True)
    del sd["encoder.middle.1.proj.bias"]
    path = tmp_path / VAE_FILE
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match="encoder.middle.1.proj.bias"):
        load_vae(path)


def test_bfloat16_weights_track_float32():
    g = load_golden("tiny_00.pt")
    vae16 = load_vae(TINY_CKPT / VAE_FILE, dtype=torch.bfloat16)
    assert vae16.dtype == torch.bfloat16
    z = vae16.encode(encoder_input(g)[:, :9])
    x = vae16.decode(g["latents"][:, :1])
    assert z.dtype == x.dtype == torch.float32
    assert rel_err(z, g["vae_encode"]["latent"][:, :3]) < 5e-2
    assert rel_err(x, g["video"][:, :1]) < 1e-1  # ~30 bf16 conv layers: measured 3.4e-2


def test_init_vae_random_is_seeded_and_loadable_shape():
    cfg = VAEConfig(dim=16, z_dim=16)
    a = init_vae_random(cfg, torch.float32, "cpu", seed=5)
    b = init_vae_random(cfg, torch.float32, "cpu", seed=5)
    c = init_vae_random(cfg, torch.bfloat16, "cpu", seed=6)
    sd_a, sd_b, sd_c = a.state_dict(), b.state_dict(), c.state_dict()
    ckpt = torch.load(TINY_CKPT / VAE_FILE, weights_only=True)
    assert {k: v.shape for k, v in sd_a.items()} == {k: v.shape for k, v in ckpt.items()}
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert all(v.dtype == torch.bfloat16 for v in sd_c.values())
    assert not torch.equal(sd_a["decoder.head.2.weight"], sd_c["decoder.head.2.weight"].float())
    video = a.decode(torch.randn(16, 2, 2, 2, generator=torch.Generator().manual_seed(0)))
    assert video.shape == (3, 5, 16, 16) and torch.isfinite(video).all()
