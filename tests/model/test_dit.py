"""model/dit/model.py against the goldens of the upstream reference (teacher forcing, caches carried)."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from model.accel import AccelOptions, optimize_dit
from model.checkpoint import CheckpointLayout
from model.config import PRESETS
from model.dit.model import CausalDiT
from model.dit.loader import load_dit
from model.dit.rope import axis_pairs
from support import GOLDEN_FILES, SHARED, chunk_calls, golden_caches, load_golden, rel_err, replay_golden

KEYS_FILE = SHARED / "docs" / "keys" / "dit_lingbot_world_fast_keys.txt"


@pytest.fixture(scope="module")
def tiny_dit(tiny_ckpt) -> CausalDiT:
    return load_dit(CheckpointLayout.discover(tiny_ckpt), torch.float32, "cpu")


@pytest.mark.parametrize("golden_file", GOLDEN_FILES, ids=lambda p: p.stem)
def test_every_dit_call_matches_golden(tiny_dit, golden_file):
    g = load_golden(golden_file.name)
    errors = []
    for call, out, caches in replay_golden(tiny_dit, g):
        assert out.dtype == torch.float32 and out.shape == call["out"].shape
        errors.append(rel_err(out, call["out"]))
        assert [c.global_end for c in caches.self_attn] == call["kv_global_end_after"]
        assert [c.local_end for c in caches.self_attn] == call["kv_local_end_after"]
    assert len(errors) == 5 * g["meta"]["num_chunks"]
    print(f"{golden_file.stem}: max rel err over {len(errors)} DiT calls = {max(errors):.3g}")
    assert max(errors) < 1e-5


def test_bf16_weights_stay_within_bf16_tolerance(tiny_ckpt):
    g = load_golden("tiny_00.pt")
    dit = load_dit(CheckpointLayout.discover(tiny_ckpt), torch.bfloat16, "cpu")
    assert dit.dtype == torch.bfloat16
    errors = []
    for call, out, caches in replay_golden(dit, g, torch.bfloat16):
        assert out.dtype == torch.float32
        assert caches.self_attn[0].k.dtype == torch.bfloat16
        errors.append(rel_err(out, call["out"]))
    print("bf16 rel err per call:", ", ".join(f"{e:.2e}" for e in errors))
    assert max(errors) < 3e-2


def test_cache_update_leaves_only_the_clean_kv(tiny_dit):
    """After a chunk's 5 calls the cache equals what one t = 0 call on the clean x0 stores."""
    g = load_golden("tiny_00.pt")
    text = tiny_dit.embed_text(g["t5"]["context"])
    caches = golden_caches(tiny_dit, g)
    t0 = torch.tensor([0.0])
    before = None
    for ch in g["chunks"]:
        start, x0 = ch["cache_update"]["current_start"], ch["cache_update"]["x"]
        cam = tiny_dit.camera_features(ch["plucker"])
        expected = golden_caches(tiny_dit, g) if before is None else before
        tiny_dit(x0, t0, ch["y"], text, cam, expected, start)
        for call in chunk_calls(ch):
            tiny_dit(call["x"], call["t"], ch["y"], text, cam, caches, call["current_start"])
        end = caches.local_end
        for got, want in zip(caches.self_attn, expected.self_attn):
            assert torch.equal(got.k[:end], want.k[:end]) and torch.equal(got.v[:end], want.v[:end])
        before = copy.deepcopy(caches)


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
@pytest.mark.parametrize("golden_file", GOLDEN_FILES, ids=lambda p: p.stem)
def test_write_kv_writes_what_the_whole_cache_update_call_writes(tiny_dit, golden_file, fast):
    """The engine's cache update (CausalDiT.write_kv: no last-block attention, FFN or head) leaves
    the caches bit for bit as the whole t = 0 call does, chunk after chunk (windows included)."""
    dit = optimize_dit(copy.deepcopy(tiny_dit), AccelOptions(fast=True)) if fast else tiny_dit
    g = load_golden(golden_file.name)
    text = dit.embed_text(g["t5"]["context"])
    whole, written = golden_caches(dit, g), golden_caches(dit, g)
    for ch in g["chunks"]:
        cam = dit.camera_features(ch["plucker"])
        for call in ch["steps"]:
            for caches in (whole, written):
                dit(call["x"], call["t"], ch["y"], text, cam, caches, call["current_start"])
        update = ch["cache_update"]
        args = (update["x"], update["t"], ch["y"], text, cam)
        assert dit.write_kv(*args, written, update["current_start"]) is None
        dit(*args, whole, update["current_start"])
        for w, c in zip(written.self_attn, whole.self_attn):
            assert (w.global_end, w.local_end) == (c.global_end, c.local_end)
            assert torch.equal(w.k, c.k) and torch.equal(w.v, c.v)
    assert whole.self_attn[-1].local_end > 0


def test_next_chunk_rope_offset_follows(tiny_dit):
    """Chunk 1's layer-0 keys are chunk-0-position keys rotated by 3 more frames on the time axis."""
    g = load_golden("tiny_00.pt")
    ch = g["chunks"][1]
    fs = g["meta"]["frame_seqlen"]
    text = tiny_dit.embed_text(g["t5"]["context"])
    cam = tiny_dit.camera_features(ch["plucker"])
    x0, t0 = ch["cache_update"]["x"], torch.tensor([0.0])
    at_zero, at_next = golden_caches(tiny_dit, g), golden_caches(tiny_dit, g)
    tiny_dit(x0, t0, ch["y"], text, cam, at_zero, 0)
    tiny_dit(x0, t0, ch["y"], text, cam, at_next, 3 * fs)
    k0 = torch.view_as_complex(at_zero.self_attn[0].k[: 3 * fs].double().unflatten(-1, (-1, 2)))
    k1 = torch.view_as_complex(at_next.self_attn[0].k[3 * fs : 6 * fs].double().unflatten(-1, (-1, 2)))
    nt = axis_pairs(tiny_dit.cfg.head_dim)[0]
    inv = 1.0 / torch.pow(10000.0, torch.arange(0, 2 * nt, 2, dtype=torch.float64) / (2 * nt))
    torch.testing.assert_close(k1[..., :nt], k0[..., :nt] * torch.polar(torch.ones(nt, dtype=torch.float64), 3 * inv),
                               rtol=0, atol=1e-5)
    assert torch.equal(k1[..., nt:], k0[..., nt:])  # height/width positions carry no offset
    # and the real session (chunk 0 then chunk 1) stores exactly these keys
    caches = golden_caches(tiny_dit, g)
    for c in g["chunks"]:
        cam_c = tiny_dit.camera_features(c["plucker"])
        for call in chunk_calls(c):
            tiny_dit(call["x"], call["t"], c["y"], text, cam_c, caches, call["current_start"])
    assert torch.equal(caches.self_attn[0].k[3 * fs : 6 * fs], at_next.self_attn[0].k[3 * fs : 6 * fs])


def test_camera_features_equal_the_in_block_computation(tiny_dit):
    """Per-chunk camera features == the reference's per-forward computation, bit for bit."""
    plucker = load_golden("tiny_00.pt")["chunks"][1]["plucker"]
    cam = tiny_dit.camera_features(plucker)
    p = rearrange(plucker, "1 c (f c1) (h c2) (w c3) -> 1 (f h w) (c c1 c2 c3)", c1=1, c2=2, c3=2)
    p = tiny_dit.patch_embedding_wancamctrl(p)
    p = p + tiny_dit.c2ws_hidden_states_layer2(F.silu(tiny_dit.c2ws_hidden_states_layer1(p)))
    x = torch.randn(1, p.shape[1], tiny_dit.cfg.dim)
    assert cam.tokens == p.shape[1] == 84
    for i, block in enumerate(tiny_dit.blocks):
        hs = block.cam_injector_layer2(F.silu(block.cam_injector_layer1(p)))
        hs = hs + p
        naive = (1.0 + block.cam_scale_layer(hs)) * x + block.cam_shift_layer(hs)
        assert torch.equal(cam.scale[i] * x + cam.shift[i], naive)


def test_embed_text_pads_with_zero_rows_before_the_mlp(tiny_dit):
    ctx = load_golden("tiny_00.pt")["t5"]["context"]
    text = tiny_dit.embed_text(ctx)
    assert text.shape == (1, 512, 128)
    padded = torch.cat([ctx, torch.zeros(512 - ctx.shape[0], ctx.shape[1])])
    assert torch.equal(text[0], tiny_dit.text_embedding(padded))
    assert text[0, -1].abs().max() > 0  # padded positions are not zero after the MLP biases
    with pytest.raises(ValueError, match="text context"):
        tiny_dit.embed_text(torch.zeros(513, 64))
    with pytest.raises(ValueError, match="text context"):
        tiny_dit.embed_text(torch.zeros(10, 32))


def test_forward_rejects_bad_inputs(tiny_dit):
    g = load_golden("tiny_00.pt")
    ch, call = g["chunks"][0], g["chunks"][0]["steps"][0]
    text = tiny_dit.embed_text(g["t5"]["context"])
    cam = tiny_dit.camera_features(ch["plucker"])
    caches = golden_caches(tiny_dit, g)
    with pytest.raises(ValueError, match="multiple of frame_seqlen"):
        tiny_dit(call["x"], call["t"], ch["y"], text, cam, caches, 5)
    with pytest.raises(ValueError, match="y must be"):
        tiny_dit(call["x"], call["t"], ch["y"][:16], text, cam, caches, 0)
    with pytest.raises(ValueError, match="camera features"):
        tiny_dit(call["x"][:, :1], call["t"], ch["y"][:, :1], text, cam, caches, 0)
    with pytest.raises(ValueError, match="plucker"):
        tiny_dit.camera_features(ch["plucker"][:, :100])
    assert caches.global_end == 0  # nothing was written by the rejected calls


def released_keys() -> dict[str, tuple[int, ...]]:
    keys = {}
    for line in KEYS_FILE.read_text().splitlines():
        m = re.fullmatch(r"(\S+) \(([\d, ]*)\)", line.strip())
        if m:
            keys[m[1]] = tuple(int(n) for n in m[2].replace(" ", "").split(",") if n)
    for name, shape in list(keys.items()):
        if name.startswith("blocks.0."):
            for i in range(1, 40):
                keys[name.replace("blocks.0.", f"blocks.{i}.", 1)] = shape
    return keys


def test_released_state_dict_keys_and_shapes():
    with torch.device("meta"):
        dit = CausalDiT(PRESETS["lingbot-world-fast"].dit)
    sd = {k: tuple(v.shape) for k, v in dit.state_dict().items()}
    assert sd == released_keys()
    assert len(sd) == 1421
    assert sum(p.numel() for p in dit.parameters()) == 18_544_332_864
