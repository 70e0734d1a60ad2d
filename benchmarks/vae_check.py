"""VAE streams of one session (conditioning encode and per-chunk decode): times and outputs,
and the deviation of a variant (bf16, channels-last) from the float32 path."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.build import Inputs
from benchmarks.measure import timed
from model.engines import VaeEngine, to_uint8


@dataclass
class VaeRun:
    encode_s: list[float]
    decode_s: list[float]
    latents: list[torch.Tensor]  # CPU float32 [16, 3, lh, lw]: y's latent channels per chunk
    videos: list[torch.Tensor]  # CPU float32 [3, 9 or 12, h, w] per chunk


def run_vae(vae: VaeEngine, inputs: Inputs, latents: list[torch.Tensor]) -> VaeRun:
    """Encode the session's conditioning chunk by chunk, and decode `latents` chunk by chunk."""
    device = vae.device
    session = vae.open(inputs.image, inputs.height, inputs.width)
    encode_s, decode_s, ys, videos = [], [], [], []
    for lat in latents:
        y, dt = timed(lambda: vae.condition(session), device)
        encode_s.append(dt)
        ys.append(y[4:].clone())
        video, dt = timed(lambda: vae.decode_float(session, lat), device)
        decode_s.append(dt)
        videos.append(video.cpu())
    vae.close(session)
    return VaeRun(encode_s, decode_s, ys, videos)


def norm_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def compare(run: VaeRun, ref: VaeRun) -> dict[str, list[float]]:
    """Per chunk: relative error of the encoded latents and of the decoded video, and the
    largest / mean absolute difference of the uint8 frames."""
    u8 = [(to_uint8(a).astype(int) - to_uint8(b).astype(int)) for a, b in zip(run.videos, ref.videos)]
    return {
        "encode_rel_err": [norm_rel_err(a, b) for a, b in zip(run.latents, ref.latents)],
        "decode_rel_err": [norm_rel_err(a, b) for a, b in zip(run.videos, ref.videos)],
        "decode_uint8_max_abs": [float(abs(d).max()) for d in u8],
        "decode_uint8_mean_abs": [float(abs(d).mean()) for d in u8],
    }
