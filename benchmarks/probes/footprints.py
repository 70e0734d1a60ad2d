"""What the 80 GB card config rests on, measured on the GPU (issue 44): the T5 in int8 against
bf16 and float32 at the released dims (random weights: bytes, encode time, the context's relative
deviation), and the VAE's session layout computed from the architecture against a real probe.

    python3 -m benchmarks.probes.footprints --out $OUT/footprints.json
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time

import torch

from model.config import preset
from model.factory import load_vae_engine, vae_cache_layout
from model.t5 import init_t5_random_on_device
from model.text_int8 import nbytes, quantize_loaded
from model.tiny import tiny_tokenizer
from model.vae.footprint import CacheLayout

GIB = 2**30
PROMPTS = ("a red car drives along a mountain road at sunset, cinematic, detailed",
           "an ancient stone temple in a misty jungle, the camera walks forward")


def timed_encode(enc, prompt: str) -> tuple[torch.Tensor, float]:
    enc.encode(prompt)  # warm
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = enc.encode(prompt)
    torch.cuda.synchronize()
    return out.float(), time.perf_counter() - t


def text(cfg) -> dict:
    f32 = init_t5_random_on_device(cfg, tiny_tokenizer(), torch.float32, "cuda", 7)
    ref = {p: timed_encode(f32, p)[0] for p in PROMPTS}
    out = {"float32_gib": nbytes(f32.model) / GIB}
    for name in ("bfloat16", "int8"):
        enc = copy.copy(f32)
        enc.model = copy.deepcopy(f32.model).to(torch.bfloat16)
        if name == "int8":
            quantize_loaded(enc.model, torch.bfloat16)
            enc.model.encoder.set_input_embeddings(enc.model.shared)
        torch.cuda.reset_peak_memory_stats()
        errs, times = [], []
        for p in PROMPTS:
            ctx, dt = timed_encode(enc, p)
            errs.append(((ctx - ref[p]).norm() / ref[p].norm()).item())
            times.append(dt)
        out[name] = {"gib": nbytes(enc.model) / GIB, "rel_err_vs_float32": errs, "encode_s": times}
        del enc
        torch.cuda.empty_cache()
    return out


def vae() -> dict:
    engine = load_vae_engine("lingbot-world-fast", None, "bfloat16", "cuda", random_weights=True)
    engine.vae.batch_frames = True
    probed = dataclasses.replace(CacheLayout.probe(engine), host_muxer=False)
    computed = vae_cache_layout(preset("lingbot-world-fast").vae, "bfloat16", batched=True, host_muxer=False)
    need = computed.footprint(464, 832)
    return {"layout_equal": probed == computed, "held_gib_464x832": need.held / GIB,
            "working_gib_464x832": need.working / GIB}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = {"device": torch.cuda.get_device_name(), "vae": vae()}
    print(json.dumps(out), flush=True)
    out["t5"] = text(preset("lingbot-world-fast").t5)
    print(json.dumps(out, indent=1))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
