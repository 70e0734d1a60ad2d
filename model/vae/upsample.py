"""The decoder's nearest 2x upsampling and the 3x3 conv after it as one conv at the low resolution.

`Upsample.resample` is nearest-exact 2x (U[y, x] = X[y // 2, x // 2]) then a 3x3 conv with zero
padding 1. An output pixel of row parity a reads source rows {i - 1, i} (a = 0: taps W0 and
W1 + W2) or {i, i + 1} (a = 1: taps W0 + W1 and W2); columns likewise. So the four output
phases (a, b) are four 3x3 kernels over the low-resolution input (each the original with two
taps summed and one zero, padding 1 at the low resolution covers the border exactly), run as
one conv with 4 x C_out channels, and a pixel shuffle puts the phases in place.

Same function up to the rounding of the summed taps; no upsampled input (4x the input's bytes)
is ever written, and the conv's output width is 4 x C_out (cuDNN's 96-channel convs ran at
434 TFLOP/s where wider ones reached 640, docs/PERFORMANCE.md). Opt-in:
`AccelOptions.vae_upsample_in_conv`.

Each phase reads only a 2x2 block of source pixels, so the 3x3 phase kernels carry 5 zero taps of
9. `kernel=2` drops them: one 2x2 conv with padding 1 over the low-resolution input gives
(h + 1) x (w + 1) positions; position (p, q) holds phase (a, b) of the output pixel
(2p - a, 2q - b) (rows {p - 1, p} are what both row phases read there), so the shuffle reads
phase (a, b) at position (i + a, j + b) for output (2i + a, 2j + b). 16 of the 36 multiplies
per output pixel and source pixel; the shuffle is still one copy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.vae.model import WanVAE
from model.vae.blocks import NearestUpsample2x, Upsample

# Row (or column) taps of the phase kernels from the original three: PHASE_TAPS[a] @ [W0, W1, W2].
PHASE_TAPS = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
                           [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
# The same without the zero row: phase a's taps over source rows {p - 1, p} of a 2x2 conv.
PHASE_TAPS_2 = torch.stack([PHASE_TAPS[0, :2], PHASE_TAPS[1, 1:]])


def phase_weights(weight: Tensor, kernel: int = 3) -> Tensor:
    """[C_out, C_in, 3, 3] -> [4 * C_out, C_in, kernel, kernel], phases (a, b) outermost, in
    float32."""
    assert kernel in (2, 3), kernel
    w = weight.float()
    taps = (PHASE_TAPS if kernel == 3 else PHASE_TAPS_2).to(w.device)
    phases = [torch.einsum("ry,oiyx,cx->oirc", taps[a], w, taps[b]) for a in (0, 1) for b in (0, 1)]
    return torch.cat(phases, dim=0)


class UpsampleConv2x(nn.Module):
    """nearest 2x + conv3x3(padding 1) as one conv at the input's resolution (3x3 or 2x2 phase
    kernels) + a pixel shuffle."""

    def __init__(self, conv: nn.Conv2d, kernel: int = 3) -> None:
        super().__init__()
        assert conv.kernel_size == (3, 3) and conv.padding == (1, 1) and conv.stride == (1, 1), conv
        self.out_channels, self.kernel = conv.out_channels, kernel
        weight = phase_weights(conv.weight, kernel).to(conv.weight.dtype)
        if not conv.weight.is_contiguous():  # channels-last weights stay channels-last
            weight = weight.contiguous(memory_format=torch.channels_last)
        self.weight = nn.Parameter(weight, requires_grad=False)
        # the bias is added by the shuffle's copy (conv then add, as F.conv2d with a bias does it)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        n, _, h, w = x.shape
        c = self.out_channels
        y = F.conv2d(x, self.weight, None, padding=1)  # [n, (a, b, c), h (+ 1), w (+ 1)]
        sn, sc, sh, sw = y.stride()
        last = y.is_contiguous(memory_format=torch.channels_last)
        # the source of output (i, a, j, b, ch) as a strided view of y: 3x3 phases read
        # y[(a, b, ch), i, j], 2x2 phases y[(a, b, ch), i + a, j + b]
        da, db = (sh, sw) if self.kernel == 2 else (0, 0)
        if last:  # memory [n, h, w, a, b, c] -> out [n, h, a, w, b, c], channels-last
            src = y.as_strided((n, h, 2, w, 2, c), (sn, sh, da + 2 * c, sw, db + c, 1), y.storage_offset())
            out = torch.empty((n, 2 * h, 2 * w, c), dtype=y.dtype, device=y.device)
            dst, bias = out.view(n, h, 2, w, 2, c), self.bias
        else:
            src = y.as_strided((n, c, h, 2, w, 2), (sn, sc, sh, da + 2 * c * sc, sw, db + c * sc), y.storage_offset())
            out = torch.empty((n, c, 2 * h, 2 * w), dtype=y.dtype, device=y.device)
            dst, bias = out.view(n, c, h, 2, w, 2), None if self.bias is None else self.bias.view(c, 1, 1, 1, 1)
        if bias is None:
            dst.copy_(src)
        else:
            torch.add(src, bias, out=dst)  # one pass: the shuffle and the bias
        return out.permute(0, 3, 1, 2) if last else out


def upsample_in_conv(vae: WanVAE, kernel: int = 3) -> int:
    """Every decoder Upsample's (nearest 2x, conv3x3) becomes an UpsampleConv2x with `kernel`
    x `kernel` phase kernels (in place); returns how many."""
    n = 0
    for module in vae.modules():
        if isinstance(module, Upsample):
            up, conv = module.resample
            assert isinstance(up, NearestUpsample2x) and isinstance(conv, nn.Conv2d), module.resample
            module.resample = UpsampleConv2x(conv, kernel)
            n += 1
    return n
