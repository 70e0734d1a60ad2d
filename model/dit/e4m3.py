"""The float8 e4m3 format every FP8 path of the project uses (the KV caches of model/dit and the
kernels of model/accel): one name for each of its constants and coded forms."""
from __future__ import annotations

import torch
from torch import Tensor

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # its largest finite value
AMAX_FLOOR = 1e-12  # the floor of an amax a scale is derived from: an all-zero row, chunk or tensor

QuantizedRows = tuple[Tensor, Tensor]  # (e4m3 [..., K], float32 row scales [..., 1]): x ~= q * scales
TensorCodes = tuple[Tensor, Tensor]  # (e4m3 codes [n, H, D], float32 descale [1]): x ~= codes * descale
