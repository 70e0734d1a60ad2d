"""Self-attention in FP8 e4m3 through cuDNN's fused FP8 SDPA (opt-in: `attention="cudnn_fp8"`).

cuDNN's FP8 flash attention (Hopper) takes Q, K and V as e4m3 codes with one descale factor
each (per tensor), computes S = Q K^T * dq * dk / sqrt(D) in float32, quantizes the softmax's
unnormalised probabilities (<= 1) with the scale 448 for the P V product, and writes O in e4m3
too (bf16 output is Blackwell-only): O is a convex combination of V's rows, so |O| <= amax(V)
and the scale 448 / amax(V) cannot overflow. With FP8 GEMMs the codes go straight into the
output projection (`codes`: the per-row scales its GEMM takes are all amax(V) / 448), which
quantizes its input to e4m3 anyway; else they are dequantized to bf16.

Q, K and V are bf16: `quantize_tensor` makes each tensor's codes and descale (amax / 448) with
no host sync (the scales stay on the device; on CUDA the two-pass Triton kernels of
`triton_tensor_quant`). K and V are the session's whole visible cache, so their quantization
is a pass over the cache per call; the FP8 product has to win that back (measured: kernel
826-883 TFLOP/s against bf16 cuDNN's 620-635 at the DiT's shapes on the H200).

The graphs are built once per (query tokens, key tokens, heads, head_dim) and cached (a session
sees one key length per chunk). Needs the `cudnn` Python frontend (nvidia-cudnn-frontend,
a wheel with no dependencies of its own) beside PyTorch's cuDNN 9, and an sm_90 GPU; `available`
says whether it can run here.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from importlib.util import find_spec

import torch
from torch import Tensor

from model.dit.e4m3 import AMAX_FLOOR, E4M3_MAX, QuantizedRows, TensorCodes  # AMAX_FLOOR: an all-zero tensor's descale is not 0
from model.dit.kv_codes import append_codes_reference

MAX_GRAPHS = 64  # built graphs kept per process (one per key length a session reaches)


def quantize_tensor(x: Tensor) -> tuple[Tensor, Tensor]:
    """x -> (float8_e4m3fn codes of x's shape, float32 descale [1]) with x ~= codes * descale."""
    descale = (x.abs().amax().float().clamp(min=AMAX_FLOOR) / E4M3_MAX).reshape(1)
    codes = (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, descale


def quantize_operand(x: Tensor) -> TensorCodes:
    """An operand quantized per call (Q without the bound scales, K and V of a bf16 cache), for
    cuDNN's and FA3's FP8 attention: `quantize_tensor`, on CUDA by the two-pass Triton kernels."""
    x = x.contiguous()
    if x.is_cuda and find_spec("triton") is not None:
        from model.accel.triton_tensor_quant import quantize_tensor as on_device

        return on_device(x)
    return quantize_tensor(x)


def append_codes(codes: tuple[Tensor, ...], descale: Tensor, new: tuple[Tensor, ...], start: int,
                 rescale: int | None = None) -> Tensor:
    """The code cache's writer (`Fp8CodesKVCache(append=...)`, model/dit/kv_codes.py): its
    `append_codes_reference`, on CUDA by three Triton kernels for K and V together (amax of the new
    rows; the rescale, which returns at once when the descale did not grow; the codes)."""
    if codes[0].is_cuda and find_spec("triton") is not None:
        from model.accel.triton_tensor_quant import append_codes as on_device

        return on_device(codes, descale, new, start, rescale)
    return append_codes_reference(codes, descale, new, start, rescale)


def available(device: torch.device | str) -> bool:
    """Whether the cuDNN FP8 attention can run on `device` (CUDA sm_90+, the frontend installed)."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
            and find_spec("cudnn") is not None)


class CudnnFp8Attention:
    """Unmasked FP8 SDPA: q [1, S, H, D], k and v [1, n, H, D] (bf16, rows of H*D) -> O [1, S, H*D]
    as e4m3 codes with row scales (`codes`) or in q's dtype (calling it)."""

    returns_codes = True  # O as e4m3 codes (`codes`): an FP8 output projection takes them as they are

    def __init__(self) -> None:
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()
        self._handles: dict[int, object] = {}
        self._lock = threading.Lock()
        self._consts: dict[int, tuple[Tensor, Tensor]] = {}

    def _cudnn(self):
        try:
            import cudnn
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError("attention='cudnn_fp8' needs the cuDNN frontend: pip install "
                               "nvidia-cudnn-frontend") from e
        return cudnn

    def _handle(self, device: torch.device):
        cudnn = self._cudnn()
        index = device.index if device.index is not None else (
            torch.cuda.current_device() if device.type == "cuda" else -1)
        if index not in self._handles:
            self._handles[index] = cudnn.create_handle()
        return self._handles[index]

    def _build(self, s: int, n: int, h: int, d: int, device: torch.device, heads_major: bool = False,
               all_plans: bool = False) -> tuple:
        """The graph for s queries and n keys. `heads_major`: Q, K, V and O as [1, H, length, D]
        contiguous instead of the cache's [1, length, H, D] rows; `all_plans`: every execution plan
        built (the attention probe times each: `execute_plan_at_index`), not only the heuristic's first."""
        cudnn = self._cudnn()
        handle = self._handle(device)
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)

        def stride(length: int) -> list[int]:  # of [B, H, S, D]
            return [h * length * d, length * d, d, 1] if heads_major else [length * h * d, d, h * d, 1]

        def rows(name: str, length: int):  # [1, length, H, D] memory seen as [B, H, S, D]
            return g.tensor(name=name, dim=[1, h, length, d], stride=stride(length),
                            data_type=cudnn.data_type.FP8_E4M3)

        def scalar(name: str):
            return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)

        q, k, v = rows("q", s), rows("k", n), rows("v", n)
        scalars = [scalar(name) for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")]
        o, _, amax_s, amax_o = g.sdpa_fp8(q=q, k=k, v=v, descale_q=scalars[0], descale_k=scalars[1],
                                          descale_v=scalars[2], descale_s=scalars[3], scale_s=scalars[4],
                                          scale_o=scalars[5], is_inference=True, attn_scale=1.0 / math.sqrt(d),
                                          use_causal_mask=False)
        o.set_output(True).set_dim([1, h, s, d]).set_stride(stride(s)).set_data_type(cudnn.data_type.FP8_E4M3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans(cudnn.build_plan_policy.ALL) if all_plans else g.build_plans()
        return g, (q, k, v, *scalars, o, amax_s, amax_o), int(g.get_workspace_size())

    def graph(self, s: int, n: int, h: int, d: int, device: torch.device | str) -> tuple:
        """The built graph for s queries and n keys (built on first use, kept LRU)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = (s, n, h, d, str(device))
        with self._lock:
            if key in self._graphs:
                self._graphs.move_to_end(key)
                return self._graphs[key]
            built = self._build(s, n, h, d, device)
            self._graphs[key] = built
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
            return built

    def _p_scales(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """(descale_s, scale_s) on `device`: P <= 1 is quantized with the scale 448."""
        key = device.index if device.index is not None else -1
        if key not in self._consts:
            self._consts[key] = (torch.full((1,), 1.0 / E4M3_MAX, device=device),
                                 torch.full((1,), E4M3_MAX, device=device))
        return self._consts[key]

    def codes(self, q: Tensor | TensorCodes, k: Tensor | TensorCodes, v: Tensor | TensorCodes) -> QuantizedRows:
        """O [1, S, H*D] as (e4m3 codes, float32 row scales [1, S, 1]): O ~= codes * scales.
        Q, K and V come in bf16 (quantized here, per call) or as (codes, descale) (the code
        cache's K and V, model/dit/kv_codes.py; Q and K made with the bound scales): taken as they are."""
        (qc, dq), (kc, dk), (vc, dv) = (x if isinstance(x, tuple) else quantize_operand(x) for x in (q, k, v))
        _, s, h, d = qc.shape
        n = kc.shape[1]
        assert kc.shape == vc.shape == (1, n, h, d), (qc.shape, kc.shape, vc.shape)
        assert kc.dtype == vc.dtype == torch.float8_e4m3fn and dk.shape == dv.shape == (1,)
        assert qc.dtype == torch.float8_e4m3fn and dq.shape == (1,)
        device = qc.device
        g, t, workspace_bytes = self.graph(s, n, h, d, device)
        out = torch.empty(qc.shape, dtype=torch.float8_e4m3fn, device=device)
        workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=device)
        cudnn = self._cudnn()
        handle = self._handle(device)
        cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream if qc.is_cuda else 0)
        g.execute(self.variant_pack(t, (qc, dq), (kc, dk), (vc, dv), out), workspace, handle=handle)
        return out.flatten(2), dv.expand(s, 1).reshape(1, s, 1).contiguous()

    def variant_pack(self, tensors: tuple, q: TensorCodes, k: TensorCodes, v: TensorCodes, out: Tensor) -> dict:
        """A built graph's `tensors` (`_build`'s second item) -> the buffers one call runs on: Q, K,
        V's codes and descales, P's scales, O's scale 1 / descale(V) (|O| <= amax(V)), `out` for
        O's codes (in the graph's layout, as Q, K and V) and two scratch amax values."""
        descale_s, scale_s = self._p_scales(out.device)
        amax_s, amax_o = torch.empty(2, 1, device=out.device).unbind(0)
        buffers = (q[0], k[0], v[0], q[1], k[1], v[1], descale_s, scale_s, 1.0 / v[1], out, amax_s, amax_o)
        return dict(zip(tensors, buffers))

    def __call__(self, q: Tensor | TensorCodes, k: Tensor | TensorCodes, v: Tensor | TensorCodes,
                 dtype: torch.dtype | None = None) -> Tensor:
        """O [1, S, H*D] in `dtype` (by default q's; needed when q comes as codes)."""
        if dtype is None:
            if isinstance(q, tuple):
                raise ValueError("the FP8 attention's output dtype: pass it when Q comes as codes")
            dtype = q.dtype
        codes, scales = self.codes(q, k, v)
        return (codes.float() * scales).to(dtype)
