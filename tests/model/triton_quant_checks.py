"""The checks of tests/model/test_triton_quant.py, run in a fresh process per mode:

    python tests/model/triton_quant_checks.py compile     # every kernel variant compiles for sm_90
    python tests/model/triton_quant_checks.py interpret   # the kernels' math in Triton's interpreter

A process of its own because Triton decides at import whether `@triton.jit` builds kernels for
the compiler or for the interpreter (TRITON_INTERPRET), and a module reloaded under the other
setting does not run in the interpreter.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.argv[1:] == ["interpret"]:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from model.accel import kernels as kn  # noqa: E402
from model.accel import triton_quant as tq  # noqa: E402
from model.accel import triton_rope as tr  # noqa: E402
from model.accel import triton_tensor_quant as tt  # noqa: E402
from model.vae import stem as vs  # noqa: E402
from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
WARPS_TIMED = (4, 16, 32)  # besides 8
CONSTS = {"FLOOR": AMAX_FLOOR, "QMAX": E4M3_MAX}


def _compile(fn, types: dict[str, str], consts: dict, num_warps: int = 8) -> None:
    signature = dict(types, **{name: "constexpr" for name in consts})
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=HOPPER,
                   options={"num_warps": num_warps})


NORM_ARGS = {"y_ptr": "*bf16", "gate_ptr": "*fp32", "cs_ptr": "*bf16", "csh_ptr": "*bf16", "xo_ptr": "*fp32",
             "w_ptr": "*fp32", "b_ptr": "*fp32", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "K": "i32", "eps": "fp32",
             "stride_x": "i32", "stride_y": "i32", "stride_cs": "i32", "stride_xo": "i32", "stride_q": "i32"}
OFF = dict(HAS_Y=False, HAS_GATE=False, HAS_CAM=False, WRITE_X=False, ROUND_NORM=False)
NORM_VARIANTS = {  # what modulated_norm_q / attn_camera_norm_q / cross_residual_norm_q launch
    "modulated, float32 residual": ("fp32", dict(OFF, MODULATE=True)),
    "modulated, bf16 residual (block 0)": ("bf16", dict(OFF, MODULATE=True, ROUND_NORM=True)),
    "attention residual + camera + affine norm": ("fp32", dict(OFF, HAS_Y=True, HAS_GATE=True, HAS_CAM=True,
                                                               WRITE_X=True, MODULATE=False)),
    "the same on a bf16 residual": ("bf16", dict(OFF, HAS_Y=True, HAS_GATE=True, HAS_CAM=True, WRITE_X=True,
                                                 MODULATE=False)),
    "cross residual + modulated norm": ("fp32", dict(OFF, HAS_Y=True, WRITE_X=True, MODULATE=True)),
}


def check_every_kernel_variant_compiles_for_hopper():
    rows = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "K": "i32", "stride_x": "i32",
            "stride_q": "i32"}
    for reciprocal in (False, True):
        for gelu, block in ((False, 8192), (True, 16384)):  # attention outputs (5120), the FFN's GELU (13824)
            _compile(tq._quantize_rows, rows, dict(CONSTS, GELU=gelu, BLOCK=block, RECIPROCAL=reciprocal))
        for x_type, flags in NORM_VARIANTS.values():
            _compile(tq._norm_quantize, {"x_ptr": f"*{x_type}", **NORM_ARGS},
                     dict(CONSTS, **flags, OUT_BF16=True, BLOCK=8192, RECIPROCAL=reciprocal))
    tensor = {"x_ptr": "*bf16", "amax_ptr": "*fp32", "N": "i32"}  # fp8_attention's per-tensor Q, K, V
    _compile(tt._abs_max, tensor, {"BLOCK": tt.BLOCK})
    _compile(tt._quantize_by_amax, dict(tensor, q_ptr="*fp8e4nv", descale_ptr="*fp32"),
             dict(CONSTS, BLOCK=tt.BLOCK))
    rows2d = {"k_ptr": "*bf16", "v_ptr": "*bf16", "L": "i32", "C": "i32", "stride_k": "i32", "stride_v": "i32"}
    blocks = {"ROWS": tt.ROWS, "COLS": tt.COLS}  # the FP8 attention's code cache (model/dit/kv_codes.py)
    _compile(tt._rows_abs_max, dict(rows2d, amax_ptr="*fp32"), blocks, num_warps=4)
    _compile(tt._rescale_codes, {"ck_ptr": "*fp8e4nv", "cv_ptr": "*fp8e4nv", "descale_ptr": "*fp32",
                                 "amax_ptr": "*fp32", "N": "i32"}, dict(CONSTS, BLOCK=tt.RESCALE_BLOCK))
    _compile(tt._quantize_rows_by, dict(rows2d, ck_ptr="*fp8e4nv", cv_ptr="*fp8e4nv", descale_ptr="*fp32",
                                        amax_ptr="*fp32"), dict(CONSTS, **blocks), num_warps=4)
    rope = {"t_ptr": "*bf16", "w_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "descale_ptr": "*fp32",
            "stride_t": "i32", "eps": "fp32"}  # the Q / K norm + RoPE at the DiT's width
    for out, codes in (("*bf16", False), ("*fp8e4nv", True)):
        _compile(tr._norm_rope, dict(rope, out_ptr=out), dict(DIM=5120, HALF_D=64, PAIRS=4096, CODES=codes,
                                                              QMAX=E4M3_MAX), num_warps=tr.WARPS)
        _compile(tr._norm_rope_looped, dict(rope, out_ptr=out),  # what the DiT's width launches
                 dict(DIM=5120, HALF_D=64, BLOCK=tr.LOOP_BLOCK, CODES=codes, QMAX=E4M3_MAX), num_warps=tr.WARPS)
    stem = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*fp32", "y_ptr": "*bf16", "M": "i32", "H": "i32",
            "W": "i32", "stride_t": "i32", "stride_h": "i32"}  # the VAE encoder's first conv, 3 -> 96
    _compile(vs._stem_conv, stem, dict(C=3, KT=3, KH=3, RUN=9, K_PAD=128, C_OUT=96, N_PAD=128,
                                       BLOCK_M=vs.BLOCK_M), num_warps=vs.WARPS)
    for warps in WARPS_TIMED:  # what benchmarks.run.triton_quant_timings launches
        _compile(tq._quantize_rows, rows, dict(CONSTS, GELU=True, BLOCK=16384, RECIPROCAL=False), warps)
        _compile(tq._norm_quantize, {"x_ptr": "*fp32", **NORM_ARGS},
                 dict(CONSTS, **NORM_VARIANTS["modulated, float32 residual"][1], OUT_BF16=True, BLOCK=8192,
                      RECIPROCAL=False), warps)


def _quotients(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference scale and unrounded code of each element (kernels.quantize_rows before e4m3)."""
    vf = v.float()
    scale = vf.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR) / E4M3_MAX
    return (vf / scale).clamp(-E4M3_MAX, E4M3_MAX), scale


def _check(got: tuple[torch.Tensor, torch.Tensor], want: torch.Tensor, rtol: float) -> None:
    codes, scale = got
    ref_codes, ref_scale = _quotients(want)
    assert codes.shape == want.shape and scale.shape == (*want.shape[:-1], 1)
    torch.testing.assert_close(scale, ref_scale, rtol=rtol, atol=0)
    torch.testing.assert_close(codes, ref_codes, rtol=rtol, atol=rtol * E4M3_MAX)
    assert float(codes.abs().max()) == E4M3_MAX  # each row's amax maps to the largest code


# float16 stands in for bfloat16 here: the interpreter computes bf16 through numpy wrongly
HALF = torch.float16
ULP = 2.0**-10  # one float16 rounding, relative


def check_row_quantization():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 320, generator=gen).to(HALF) * 3
    x[5] = 0.0  # an all-zero row: the floor scale, zero codes
    _check(tq._launch(x, gelu=False, codes=torch.float32), x, rtol=1e-6)
    _check(tq._launch(x[None, :, :200], gelu=False, codes=torch.float32), x[None, :, :200], rtol=1e-6)  # strided
    # the GELU (tanh form) rounded to the input dtype before its amax, as F.gelu on that dtype
    _check(tq._launch(x, gelu=True, codes=torch.float32), F.gelu(x, approximate="tanh"), rtol=2 * ULP)


def check_norm_regions(residual: torch.dtype):
    gen = torch.Generator().manual_seed(1)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    s, k, eps = 29, 320, 1e-6
    x = (r(1, s, k) * 2 + 0.5).to(residual)
    scale, shift, gate, w, b = r(1, 1, k) * 0.1, r(1, 1, k) * 0.1, r(1, 1, k), r(k), r(k) * 0.1
    attn, cross = r(1, s, k).to(HALF), r(1, s, k).to(HALF)
    cam_scale, cam_shift = r(1, s, 2 * k).to(HALF).chunk(2, dim=-1)  # views with a row stride of 2k

    _, got = tq._norm_launch(x, scale, shift, eps, HALF, modulate=True, codes=torch.float32)
    _check(got, kn.modulated_norm(x, scale, shift, eps, HALF), rtol=2 * ULP)

    x_new, got = tq._norm_launch(x, w, b, eps, HALF, modulate=False, y=attn, gate=gate,
                                 cam=(cam_scale, cam_shift), write_x=True, codes=torch.float32)
    want_x, want = kn.attn_camera_norm(x, attn, gate, cam_scale, cam_shift, w, b, eps, HALF)
    assert x_new.dtype == want_x.dtype == torch.float32
    torch.testing.assert_close(x_new, want_x, rtol=1e-6, atol=1e-6)
    _check(got, want, rtol=2 * ULP)

    if residual == torch.float32:  # after the first residual add the stream is float32
        x_new, got = tq._norm_launch(x, scale, shift, eps, HALF, modulate=True, y=cross, write_x=True,
                                     codes=torch.float32)
        want_x, want = kn.cross_residual_norm(x, cross, scale, shift, eps, HALF)
        torch.testing.assert_close(x_new, want_x, rtol=1e-6, atol=1e-6)
        _check(got, want, rtol=2 * ULP)


def check_tensor_quantization():
    """triton_tensor_quant: one amax over every program's block, descale = amax / 448, codes =
    x * 448 / amax (within two float32 roundings of the division), the largest at 448."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3 * tt.BLOCK + 17, generator=gen) * 3).to(HALF)
    x[2 * tt.BLOCK + 5] = -40.0  # the amax sits in a later program's block
    codes, descale = tt.quantize_tensor(x, codes=torch.float32)
    assert codes.shape == x.shape and descale.shape == (1,)
    assert descale.item() == (torch.tensor(40.0) / E4M3_MAX).item()  # float32 division
    torch.testing.assert_close(codes, (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX), rtol=2.5e-7, atol=1e-5)
    assert codes[2 * tt.BLOCK + 5].item() == -E4M3_MAX
    zeros, floor = tt.quantize_tensor(torch.zeros(5, 7, dtype=HALF), codes=torch.float32)
    assert not zeros.any() and floor.item() == (torch.tensor(AMAX_FLOOR) / E4M3_MAX).item()


def check_code_cache():
    """triton_tensor_quant.append_codes: model/dit/kv_codes.py append_codes_reference's descales and
    (unrounded: float32 codes) quotients, K a contiguous tensor, V a strided view of a fused
    projection; the cached codes rescaled only when a louder chunk grows the descale."""
    from model.dit.kv_codes import append_codes_reference

    gen = torch.Generator().manual_seed(4)
    heads, dim = 2, 640  # rows of 1280: two column blocks, the second partial
    got = (torch.zeros(40, heads, dim), torch.zeros(40, heads, dim), torch.zeros(2))
    want = tuple(t.clone() for t in got)
    start = 0
    for amp in (1.0, 3.0, 0.5, 5.0):
        fused = (torch.randn(9, 3 * heads * dim, generator=gen) * amp).to(HALF)
        k = fused[:, : heads * dim].unflatten(-1, (heads, dim)).contiguous()
        v = fused[:, 2 * heads * dim :].unflatten(-1, (heads, dim))
        tt.append_codes(got[:2], got[2], (k, v), start)
        append_codes_reference(want[:2], want[2], (k, v), start)
        start += 9
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
        for g, w in zip(got[:2], want[:2]):
            torch.testing.assert_close(g, w, rtol=2.5e-7, atol=1e-5)
    assert got[0][:start].abs().max().item() == E4M3_MAX
    # V alone (a cache whose K comes coded), a ring's write: the rows at slot 4, every valid slot
    # [0, 36) rescaled when the descale grows
    for amp in (2.0, 9.0):
        v = (torch.randn(9, heads, dim, generator=gen) * amp).to(HALF)
        tt.append_codes(got[1:2], got[2][1:], (v,), 4, rescale=36)
        append_codes_reference(want[1:2], want[2][1:], (v,), 4, rescale=36)
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=2.5e-7, atol=1e-5)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)  # K untouched


def check_norm_rope():
    """triton_rope: kernels.qk_norm_rope's values (rows strided as the fused projection's q / k
    slices, a width whose pairs do not fill a power of two) and, as codes with a fixed descale,
    its quotients; the RoPE table of each token applied to every head."""
    gen = torch.Generator().manual_seed(6)
    heads, head_dim, tokens = 3, 16, 7  # dim 48: 24 pairs in a block of 32
    dim = heads * head_dim
    fused = (torch.randn(1, tokens, 3 * dim, generator=gen) * 5).to(HALF)
    t = fused[..., dim : 2 * dim]  # k's slice: rows of stride 3 * dim
    weight = (torch.rand(dim, generator=gen) + 0.5).to(HALF)
    angles = torch.rand(tokens, 1, head_dim // 2, generator=gen) * 6.3
    cos, sin = angles.cos(), angles.sin()
    want = kn.qk_norm_rope(t, weight, cos, sin, 1e-6, heads)
    got = tr.qk_norm_rope(t, weight, cos, sin, 1e-6, heads)
    assert got.shape == (1, tokens, heads, head_dim) and got.dtype == HALF
    torch.testing.assert_close(got.float(), want.float(), rtol=2 * ULP, atol=1e-3)
    looped = tr._launch(t, weight, cos, sin, 1e-6, heads, None, HALF, block=8, warps=1)  # 3 blocks of 8 pairs
    torch.testing.assert_close(looped.float(), want.float(), rtol=2 * ULP, atol=1e-3)
    descale = torch.tensor([kn.rope_norm_bound(weight) / E4M3_MAX])
    quotients = tr.qk_norm_rope_codes(t, weight, cos, sin, 1e-6, heads, descale, codes=torch.float32)
    torch.testing.assert_close(quotients, want.float() / descale, rtol=2 * ULP, atol=1e-3 / descale.item())
    assert quotients.abs().max().item() < E4M3_MAX
    codes = tr.qk_norm_rope_codes(t, weight, cos, sin, 1e-6, heads, descale)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == got.shape


def _stream_conv_cases(c_in: int, c_out: int, seed: int):
    """(dtype, rtol, x, past, weight, bias, want) for a stream's input with no past, one and two
    cached frames (the missing ones zeros): F.conv3d on the same (rounded) values."""
    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(c_out, c_in, 3, 3, 3, generator=gen), torch.randn(c_out, generator=gen)
    for dtype, rtol in ((torch.float32, 1e-5), (HALF, 2 * ULP)):
        for n_past in (0, 1, 2):
            x = torch.randn(1, c_in, 3, 9, 21, generator=gen).to(dtype)  # 9 x 21 pixels: a partial block
            past = torch.randn(1, c_in, n_past, 9, 21, generator=gen).to(dtype) if n_past else None
            frames = x if past is None else torch.cat([past, x], dim=2)
            want = F.conv3d(F.pad(frames.float(), (1, 1, 1, 1, 2 - n_past, 0)), weight.to(dtype).float(), bias)
            yield dtype, rtol, x, past, weight.to(dtype), bias, want


def _check_conv_out(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, rtol: float) -> None:
    assert got.shape == want.shape and got.dtype == dtype
    assert got.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=rtol * want.abs().max().item())


def check_stem_conv():
    """vae_stem (3 -> 24 channels here: a width that fills no power of two) against F.conv3d,
    with no past, one and two cached frames."""
    for dtype, rtol, x, past, weight, bias, want in _stream_conv_cases(3, 24, seed=7):
        buf = vs.padded_input(x, past, 2, (1, 1))
        got = vs.stem_conv(buf, vs.pack_stem_weight(weight), bias, (3, 3, 3), 24, block_m=16)
        _check_conv_out(got, want, dtype, rtol)  # 4 programs walking 36 blocks of 16 pixels


def check_stem_in_the_vae():
    """A VAE whose encoder's first conv is the Triton one encodes and decodes a stream (first call
    1 + 4k frames, then 4k, caches carried) as the plain VAE does."""
    from model.config import VAEConfig
    from model.vae.model import init_vae_random
    from model.vae.cache import VaeCache

    plain = init_vae_random(VAEConfig(dim=8), torch.float32, "cpu", 0)
    fast = init_vae_random(VAEConfig(dim=8), torch.float32, "cpu", 0)
    assert vs.triton_stem(fast) == 1 and isinstance(fast.encoder.conv1, vs.TritonStemConv3d)
    video = torch.rand(3, 9, 16, 24, generator=torch.Generator().manual_seed(8)) * 2 - 1
    caches = [[VaeCache.empty(), VaeCache.empty()] for _ in range(2)]
    for part in (video[:, :5], video[:, 5:]):
        out = []
        for vae, (enc, dec) in zip((plain, fast), caches):
            z, enc = vae.encode_chunk(part, enc)
            x, dec = vae.decode_chunk(z, dec)
            out.append((z, x, enc, dec))
        caches = [[o[2], o[3]] for o in out]
        torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-4, atol=1e-4)  # latents
        torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-4, atol=1e-4)  # video


def check_reciprocal_codes():
    """Launch(reciprocal=True): the same scales, quotients within two float32 roundings."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(23, 320, generator=gen).to(HALF) * 3
    fast = tq.Launch(reciprocal=True)
    _check(tq._launch(x, gelu=False, codes=torch.float32, launch=fast), x, rtol=2.5e-7)
    scale, shift = torch.randn(1, 1, 320, generator=gen) * 0.1, torch.randn(1, 1, 320, generator=gen) * 0.1
    x32 = torch.randn(1, 23, 320, generator=gen)
    _, got = tq._norm_launch(x32, scale, shift, 1e-6, HALF, modulate=True, codes=torch.float32, launch=fast)
    _check(got, kn.modulated_norm(x32, scale, shift, 1e-6, HALF), rtol=2 * ULP)
    exact = tq._launch(x, gelu=False, codes=torch.float32)[0]
    assert not torch.equal(tq._launch(x, gelu=False, codes=torch.float32, launch=fast)[0], exact), \
        "the reciprocal path gave the division's bits on every code: is RECIPROCAL reaching the kernel?"


def check_public_functions():
    x = torch.randn(1, 12, 64).to(HALF)
    q, scale = tq.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and scale.shape == (1, 12, 1)
    x32 = torch.randn(1, 12, 64)
    try:
        tq.cross_residual_norm_q(x32.to(HALF), x, torch.zeros(1, 1, 64), torch.zeros(1, 1, 64), 1e-6, HALF)
    except AssertionError as e:
        assert "float32 residual" in str(e)
    else:
        raise AssertionError("a 16-bit residual was taken")
    x_new, (q, scale) = tq.cross_residual_norm_q(x32, x, torch.zeros(1, 1, 64), torch.zeros(1, 1, 64), 1e-6, HALF)
    assert x_new.shape == x32.shape and q.dtype == torch.float8_e4m3fn and scale.shape == (1, 12, 1)


def check_block_kernels_run_the_tuned_launches():
    """fp8_quant="triton": the four kernels with their TUNED launches (the reciprocal), the row
    quantization the plain function; each gives the scales of the function it replaces."""
    fns = kn.BlockKernels.build("default", compile=False, quant="triton")
    for name, fn in (("modulated_norm_q", fns.modulated_norm), ("attn_camera_norm_q", fns.attn_camera_norm),
                     ("cross_residual_norm_q", fns.cross_residual_norm), ("gelu_quantize", fns.gelu_quantize)):
        assert fn.func is getattr(tq, name) and fn.keywords == {"launch": tq.TUNED[name]}, (name, fn)
        assert tq.TUNED[name].reciprocal, name
    assert fns.quantize_rows is kn.quantize_rows
    assert fns.qk_norm_rope is kn.qk_norm_rope and not fns.triton_rope
    roped = kn.BlockKernels.build("default", compile=False, triton_rope=True)
    assert roped.qk_norm_rope is tr.qk_norm_rope and roped.qk_norm_rope_codes is tr.qk_norm_rope_codes
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(9, 320, generator=gen).to(HALF) * 2
    torch.testing.assert_close(fns.gelu_quantize(h)[1], kn.gelu_quantize(h)[1], rtol=2 * ULP, atol=0)
    x32 = torch.randn(1, 9, 320, generator=gen)
    scale, shift = torch.randn(1, 1, 320, generator=gen) * 0.1, torch.randn(1, 1, 320, generator=gen) * 0.1
    torch.testing.assert_close(fns.modulated_norm(x32, scale, shift, 1e-6, HALF)[1],
                               kn.modulated_norm_q(x32, scale, shift, 1e-6, HALF)[1], rtol=2 * ULP, atol=0)


def main(mode: str) -> None:
    if mode == "compile":
        check_every_kernel_variant_compiles_for_hopper()
    elif mode == "interpret":
        check_row_quantization()
        check_reciprocal_codes()
        check_tensor_quantization()
        check_code_cache()
        check_norm_rope()
        check_stem_conv()
        check_stem_in_the_vae()
        for residual in (torch.float32, HALF):
            check_norm_regions(residual)
        check_public_functions()
        check_block_kernels_run_the_tuned_launches()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"{mode}: ok")


if __name__ == "__main__":
    main(sys.argv[1])
