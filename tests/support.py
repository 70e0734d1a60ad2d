"""Paths and helpers shared by the tests (importable as `support`)."""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LWF_SHARED", REPO.parent / "shared")).resolve()
GOLDEN_DIR = SHARED / "golden"
TINY_CKPT = SHARED / "ckpt" / "tiny-lingbot-world-base-cam"
EXAMPLES = SHARED / "examples"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.pt"))  # empty without ../shared: parametrizing fails at collection

_golden_cache: dict[str, dict] = {}


def load_golden(name: str) -> dict:
    """Load a golden run once per test session (they are a few MB each)."""
    import torch

    if name not in _golden_cache:
        g = torch.load(GOLDEN_DIR / name, weights_only=True)
        assert g["format"] == "lwf-golden-v1"
        _golden_cache[name] = g
    return _golden_cache[name]


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (the goldens' tolerance measure)."""
    import torch

    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    denom = b.abs().max().item() or 1.0
    return (a - b).abs().max().item() / denom


def golden_caches(dit, g: dict, dtype=None):
    """Empty DiT caches for a golden run's geometry and window (CPU; float32 by default)."""
    import torch

    from model.dit.caches import DiTCaches

    m = g["meta"]
    cfg = dit.cfg.with_window(m["local_attn_size"], m["sink_size"])
    return DiTCaches.allocate(cfg, m["frame_seqlen"], m["lat_f"], dtype or torch.float32, "cpu")


def chunk_calls(ch: dict) -> list[dict]:
    """A golden chunk's DiT calls in order: the denoising steps, then the cache update."""
    return ch["steps"] + [ch["cache_update"]]


def replay_golden(dit, g: dict, dtype=None):
    """Every DiT call of a golden in order; yields (call, output, caches after the call)."""
    caches = golden_caches(dit, g, dtype)
    text = dit.embed_text(g["t5"]["context"])
    for ch in g["chunks"]:
        cam = dit.camera_features(ch["plucker"])  # once per chunk, shared by its 5 calls
        for call in chunk_calls(ch):
            out = dit(call["x"], call["t"], ch["y"], text, cam, caches, call["current_start"])
            yield call, out, caches


def wait_healthy(http: str, timeout_s: float = 180.0) -> None:
    """Until the serve app at `http` answers /healthz with 200; fails the test after `timeout_s`."""
    import time

    import httpx
    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{http}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the serve app at {http} did not become healthy within {timeout_s:g} s")
        time.sleep(0.5)


def install_fake_fa4(monkeypatch) -> list[tuple[int, int]]:
    """A stand-in `flash_attn.cute` computing what FlashAttention's interface computes ([B, S, H, D]
    in and out, an (out, lse) pair) with SDPA, for CPU tests of code that calls it; returns the
    (query tokens, key tokens) of every call."""
    import sys
    import types

    import torch
    import torch.nn.functional as F

    calls: list[tuple[int, int]] = []

    def flash_attn_func(q, k, v):
        assert q.shape[0] == 1 and q.shape[2:] == k.shape[2:] == v.shape[2:] and k.shape == v.shape
        calls.append((q.shape[1], k.shape[1]))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    package = types.ModuleType("flash_attn")
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


def install_fake_fa3(monkeypatch, calls: list[dict] | None = None) -> list[dict]:
    """A stand-in `fa3_fwd_interface` whose `flash_attn_func` checks what FA3's forward takes
    (q [B, S, H, D], k and v [B, n, H_kv, D], last dimension contiguous; bf16 without descales, or
    e4m3 codes with float32 q/k/v descales [B, H_kv]) and computes it in float32: the codes
    dequantized with the descales passed (head h of Q with its KV head's), softmax(Q K^T / sqrt(D))
    V; out in bf16 for e4m3 inputs (FA3's), else in q's dtype. Returns the calls' records:
    shapes, dtypes and the descales as given."""
    import sys
    import types

    import torch

    calls = [] if calls is None else calls

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, q_descale=None, k_descale=None,
                        v_descale=None, return_attn_probs=False, **rest):
        b, s, h, d = q.shape
        n, hk = k.shape[1], k.shape[2]
        assert q.dim() == 4 and k.shape == v.shape == (b, n, hk, d) and h % hk == 0, (q.shape, k.shape, v.shape)
        assert not causal and not rest and all(x.stride(-1) == 1 for x in (q, k, v))
        fp8 = q.dtype == torch.float8_e4m3fn
        assert k.dtype == v.dtype == q.dtype, (q.dtype, k.dtype, v.dtype)
        descales = (q_descale, k_descale, v_descale)
        calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "dtype": q.dtype,
                      "descales": [None if x is None else x.clone() for x in descales]})
        if fp8:
            for x in descales:
                assert x is not None and x.dtype == torch.float32 and x.shape == (b, hk) and x.is_contiguous()
            group = lambda t, dsc: t.float() * dsc.repeat_interleave(t.shape[2] // hk, dim=1)[:, None, :, None]  # noqa: E731
            qf, kf, vf = group(q, q_descale), group(k, k_descale), group(v, v_descale)
        else:
            assert all(x is None for x in descales), "descales are FP8 inputs' only"
            qf, kf, vf = q.float(), k.float(), v.float()
        kf, vf = (x.repeat_interleave(h // hk, dim=2) for x in (kf, vf))
        scale = d ** -0.5 if softmax_scale is None else softmax_scale
        p = torch.softmax(torch.einsum("bshd,bnhd->bhsn", qf, kf) * scale, dim=-1)
        out = torch.einsum("bhsn,bnhd->bshd", p, vf).to(torch.bfloat16 if fp8 else q.dtype)
        return (out, torch.zeros(b, h, s)) if return_attn_probs else out

    module = types.ModuleType("fa3_fwd_interface")
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", module)
    return calls


class _FakeCudnnTensor:
    def __init__(self, name="", dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.data_type, self.output = name, dim, stride, data_type, False

    def set_output(self, on):
        self.output = on
        return self

    def set_dim(self, dim):
        self.dim = dim
        return self

    def set_stride(self, stride):
        self.stride = stride
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self


class FakeCudnnGraph:
    """What cuDNN's FP8 SDPA computes: S = Q K^T dq dk scale; O = softmax(S) (V dv) * scale_o in
    e4m3 (P's own scale and descale cancel), Q/K/V/O read and written through their
    dims/strides."""

    builds = 0

    def __init__(self, **kwargs):
        self.tensors = []

    def tensor(self, name, dim, stride, data_type):
        t = _FakeCudnnTensor(name, list(dim), list(stride), data_type)
        self.tensors.append(t)
        return t

    def sdpa_fp8(self, q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, is_inference,
                 attn_scale, use_causal_mask):
        assert is_inference and not use_causal_mask
        self.io = dict(q=q, k=k, v=v, dq=descale_q, dk=descale_k, dv=descale_v, ds=descale_s, ss=scale_s,
                       so=scale_o, o=_FakeCudnnTensor("o"), amax_s=_FakeCudnnTensor("amax_s"), amax_o=_FakeCudnnTensor("amax_o"))
        self.attn_scale = attn_scale
        return self.io["o"], None, self.io["amax_s"], self.io["amax_o"]

    def validate(self):
        assert all(self.io[name].output for name in ("o", "amax_s", "amax_o"))

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        assert modes

    def check_support(self):
        pass

    def build_plans(self, policy="HEURISTICS_CHOICE"):
        FakeCudnnGraph.builds += 1
        self.policy = policy

    def get_workspace_size(self):
        return 0

    def execute(self, buffers, workspace, handle=None):
        import torch

        t = {name: buffers[ref] for name, ref in self.io.items()}
        view = lambda name: t[name].as_strided(self.io[name].dim, self.io[name].stride)  # noqa: E731
        assert all(self.io[n].data_type == "FP8_E4M3" and t[n].dtype == torch.float8_e4m3fn for n in "qkvo")
        q, k, v = (view(n).float() for n in "qkv")
        s = q @ k.transpose(-1, -2) * t["dq"] * t["dk"] * self.attn_scale
        o = torch.softmax(s, dim=-1) * t["ss"] @ (v * t["dv"]) * t["ds"] * t["so"]
        view("o").copy_(o.to(t["o"].dtype))


def install_fake_cudnn(monkeypatch):
    """A stand-in `cudnn` module (FakeCudnnGraph) in sys.modules for this test."""
    enum = lambda *names: types.SimpleNamespace(**{n: n for n in names})  # noqa: E731
    module = types.SimpleNamespace(
        data_type=enum("FP8_E4M3", "BFLOAT16", "FLOAT"), heur_mode=enum("A", "FALLBACK"),
        build_plan_policy=enum("HEURISTICS_CHOICE", "ALL"),
        create_handle=lambda: object(), set_stream=lambda handle, stream: None, pygraph=FakeCudnnGraph)
    monkeypatch.setitem(sys.modules, "cudnn", module)
    FakeCudnnGraph.builds = 0
    return module


def open_tiny_dit_session(engine, total_latent_frames):
    """A 64x112 session of `engine` (the tiny DiT) with a seeded random text context, open-ended
    when `total_latent_frames` is None: the engine tests' common start."""
    import torch

    from model.session import DiTSessionSpec

    gen = torch.Generator().manual_seed(2)
    return engine.open(DiTSessionSpec(context=torch.randn(6, engine.cfg.text_dim, generator=gen), height=64,
                                      width=112, seed=4, total_latent_frames=total_latent_frames))
