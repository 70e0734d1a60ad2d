"""model/dit/rope.py against an independent complex-number implementation of spec A.4."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from model.dit.rope import MAX_FRAMES, Rope3D, axis_pairs


def reference_freqs(head_dim: int) -> torch.Tensor:
    """complex128 [1024, head_dim/2]: concat(rope_params(1024, d - 4(d//6)), 2 x rope_params(1024, 2(d//6)))."""
    d = head_dim

    def rope_params(n: int) -> torch.Tensor:
        angles = np.outer(np.arange(MAX_FRAMES), 1.0 / np.power(10000.0, np.arange(0, n, 2) / n))
        return torch.from_numpy(np.exp(1j * angles))

    return torch.cat([rope_params(d - 4 * (d // 6)), rope_params(2 * (d // 6)), rope_params(2 * (d // 6))], 1)


def reference_apply(x: torch.Tensor, grid: tuple[int, int, int], freqs: torch.Tensor, start: int) -> torch.Tensor:
    """x [S, heads, head_dim]: complex multiply of consecutive pairs in float64."""
    f, h, w = grid
    nt, nh, nw = axis_pairs(x.shape[-1])
    ft, fh, fw = freqs.split([nt, nh, nw], dim=1)
    table = torch.cat(
        [
            ft[start : start + f].view(f, 1, 1, -1).expand(f, h, w, -1),
            fh[:h].view(1, h, 1, -1).expand(f, h, w, -1),
            fw[:w].view(1, 1, w, -1).expand(f, h, w, -1),
        ],
        dim=-1,
    ).reshape(f * h * w, 1, -1)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * table).flatten(-2).to(x.dtype)


def test_axis_split_matches_spec():
    assert axis_pairs(128) == (22, 21, 21)  # 44, 42, 42 dims
    assert axis_pairs(64) == (12, 10, 10)
    assert sum(axis_pairs(128)) == 64


@pytest.mark.parametrize("head_dim", [64, 128])
def test_table_values(head_dim):
    rope = Rope3D(head_dim)
    freqs = reference_freqs(head_dim)
    f, h, w, start = 3, 4, 5, 7
    table = rope.chunk_table(start, (f, h, w), "cpu")
    assert table.cos.shape == (f * h * w, 1, head_dim // 2) and table.dtype == torch.float64
    nt, nh, nw = axis_pairs(head_dim)
    token = 2 * h * w + 3 * w + 1  # (f=2, h=3, w=1)
    expected = torch.cat([freqs[start + 2, :nt], freqs[3, nt : nt + nh], freqs[1, nt + nh :]])
    torch.testing.assert_close(table.cos[token, 0], expected.real, rtol=0, atol=1e-13)
    torch.testing.assert_close(table.sin[token, 0], expected.imag, rtol=0, atol=1e-13)


@pytest.mark.parametrize("start", [0, 3, 9])
def test_apply_equals_complex_reference(start):
    torch.manual_seed(0)
    grid = (3, 4, 7)
    x = torch.randn(3 * 4 * 7, 2, 64)
    rope = Rope3D(64)
    out = rope.chunk_table(start, grid, "cpu").apply(x)
    expected = reference_apply(x, grid, reference_freqs(64), start)
    assert out.dtype == torch.float32
    assert (out - expected).abs().max().item() <= 1e-6
    # batch dims in front are broadcast
    torch.testing.assert_close(rope.chunk_table(start, grid, "cpu").apply(x[None])[0], out, rtol=0, atol=0)


def test_offset_is_absolute():
    """Frame f of a chunk starting at s gets the rotation of frame f + s of a chunk at 0."""
    rope = Rope3D(64)
    h, w, s = 4, 5, 6
    late = rope.chunk_table(s, (3, h, w), "cpu")
    early = rope.chunk_table(0, (3 + s, h, w), "cpu")
    assert torch.equal(late.cos, early.cos[s * h * w :])
    assert torch.equal(late.sin, early.sin[s * h * w :])


def test_rotation_preserves_norm_and_dtype():
    x = torch.randn(24, 2, 64, dtype=torch.bfloat16)
    out = Rope3D(64).chunk_table(4, (2, 3, 4), "cpu").apply(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().norm(dim=-1), x.float().norm(dim=-1), rtol=1e-2, atol=0)


def test_chunk_table_is_memoised_and_bounded():
    rope = Rope3D(64)
    a = rope.chunk_table(3, (3, 4, 7), "cpu")
    assert rope.chunk_table(3, (3, 4, 7), "cpu") is a  # the 5 calls of a chunk share one table
    assert rope.chunk_table(6, (3, 4, 7), "cpu") is not a
    for s in range(40):
        rope.chunk_table(s, (3, 2, 2), "cpu")
    assert len(rope._chunks) <= 16


def test_beyond_the_table_is_an_error():
    rope = Rope3D(64)
    rope.chunk_table(MAX_FRAMES - 3, (3, 2, 2), "cpu")
    with pytest.raises(ValueError, match="1024"):
        rope.chunk_table(MAX_FRAMES - 2, (3, 2, 2), "cpu")


def test_copies_and_pickles_rebuild_the_memo():
    import copy
    import pickle

    rope = Rope3D(64)
    table = rope.chunk_table(3, (3, 2, 2), "cpu")
    for clone in (copy.deepcopy(rope), pickle.loads(pickle.dumps(rope))):
        assert not clone._chunks
        again = clone.chunk_table(3, (3, 2, 2), "cpu")
        assert torch.equal(again.cos, table.cos) and torch.equal(again.sin, table.sin)
