"""Every shipped single-card GPU config admits at least one session at its default size on the card
it names (issue 44: serve_config.gpu.yaml, made for an 80 GB card, refused every session there).

The arithmetic is the replicas' own (`session_budget`, then `SessionTable.admit` until `Busy`) on
the footprints the code computes (the DiT engine's on the meta device, the VAE's `CacheLayout`
from its architecture, the T5's bytes in its configured weights) and what a served run measured
(benchmarks/results/h200_round3_serve_window_models_start.json: the bf16 DiT's resident bytes after
warm-up, the VAE's, the T5's encode overhead above its weights). The cards' sizes are what torch
reports for them (the H100's from the H100 run's cap at its share). The H100 run of
serve_config.gpu.yaml (h100_round4_gpu_config.json) served one session with these shares.
"""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks.overlay import resolve
from deployments.config import AppArgs
from deployments.errors import Busy, TooLarge
from deployments.replicas.memory import SLACK_SHARE, session_budget
from deployments.replicas.session_table import SessionTable
from model.config import preset
from model.dit.caches import KVCacheConfig
from model.dit.model import CausalDiT
from model.engines import DiTEngine
from model.factory import vae_cache_layout
from model.text_int8 import nbytes, swap_in_int8
from support import REPO

H100 = REPO / "benchmarks/results/h100_round4_gpu_config.json"  # serve_config.gpu.yaml served on an H100
BF16_RUN = REPO / "benchmarks/results/h200_round3_serve_window_models_start.json"
H200_SHARES = {"dit": 0.75, "vae": 0.11, "text_encoder": 0.14}  # that run's config (serve_config.h200.yaml's)


def card_bytes(kind: str) -> int:
    if kind == "h100":
        dit = json.loads(H100.read_text())["models_start"]["data"][0]["replicas"]["dit"][0]
        return int(dit["memory_cap_bytes"] / 0.75)  # serve_config.gpu.yaml's DiT share
    replicas = json.loads(BF16_RUN.read_text())["data"][0]["replicas"]
    return int(replicas["dit"][0]["memory_cap_bytes"] / H200_SHARES["dit"])


CONFIGS = {"serve_config.gpu.yaml": "h100", "serve_config.h200.yaml": "h200"}


@pytest.fixture(scope="module")
def measured() -> dict:
    return {k: v[0] for k, v in json.loads(BF16_RUN.read_text())["data"][0]["replicas"].items()}


def admitted(slots: int, budget: int, held: int, working: int) -> int:
    table: SessionTable = SessionTable(slots, budget, idle_ttl_s=300, retry_after_s=5)
    for n in range(slots):
        try:
            table.admit(f"s{n}", held, working, reserve_only=True)
        except (Busy, TooLarge):
            return n
    return slots


def t5_weight_bytes(args: AppArgs) -> int:
    from transformers import UMT5EncoderModel

    from model.t5 import umt5_config

    with torch.device("meta"):
        model = UMT5EncoderModel(umt5_config(preset(args.model.preset).t5)).to(torch.bfloat16)
        if args.model.text_weights == "int8":
            swap_in_int8(model, torch.bfloat16)
    model.encoder.set_input_embeddings(model.shared)  # tied: counted once
    return nbytes(model)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_shipped_gpu_config_admits_a_session_at_its_default_size_on_its_card(name, measured):
    args = AppArgs.model_validate(resolve(REPO / name)["applications"][0]["args"])
    card = card_bytes(CONFIGS[name])
    m = args.model
    h, w = (int(x) for x in m.size_buckets[0].split("*"))  # the first bucket: what a 16:9 session gets
    assert args.dit.num_gpus + args.vae.num_gpus + args.text_encoder.num_gpus <= 1.0 + 1e-9
    # DiT: the window session, held and while its chunk runs
    cfg = preset(m.preset).dit.with_window(m.local_attn_size, m.sink_size)
    with torch.device("meta"):
        dit = CausalDiT(cfg).to(torch.bfloat16)
    engine = DiTEngine(dit, kv=KVCacheConfig.for_serving("cuda", m.kv_cache, m.fp8_attention))
    need = engine.footprint(h, w, engine.kv_frames(None), None)
    dit_budget = session_budget(None, int(args.dit.num_gpus * card), measured["dit"]["resident_bytes"])
    assert admitted(args.sessions.max_sessions, dit_budget, need.held, need.working) >= 1, name
    # VAE: its layout from the architecture, its measured resident weights
    vae = vae_cache_layout(preset(m.preset).vae, m.vae_dtype, batched=True, host_muxer=False).footprint(h, w)
    vae_budget = session_budget(None, int(args.vae.num_gpus * card), measured["vae"]["resident_bytes"])
    vae_slots = args.sessions.vae_max_sessions or 2 * args.sessions.max_sessions * args.dit.most_replicas
    assert admitted(vae_slots, vae_budget, vae.held, vae.working) >= 1, name
    # T5: its weights in the configured form, plus what an encode took above them in the bf16 run
    t5 = measured["text_encoder"]
    encode = t5["peak_memory_bytes"] - t5["memory_allocated_bytes"]
    assert t5_weight_bytes(args) + encode <= (1 - SLACK_SHARE) * args.text_encoder.num_gpus * card, name


def test_the_bf16_t5_shares_hold_no_vae_session_on_an_80_gb_card(measured):
    """The failure of issue 44, reproduced by the same arithmetic: serve_config.h200.yaml's shares on
    an H100 leave the VAE a budget below one 464x832 session."""
    args = AppArgs.model_validate(resolve(REPO / "serve_config.h200.yaml")["applications"][0]["args"])
    vae = vae_cache_layout(preset("lingbot-world-fast").vae, "bfloat16", batched=True, host_muxer=False).footprint(464, 832)
    budget = session_budget(None, int(args.vae.num_gpus * card_bytes("h100")), measured["vae"]["resident_bytes"])
    assert admitted(4, budget, vae.held, vae.working) == 0
    with pytest.raises(TooLarge, match=r"needs 8\.58 GiB .* budget is 8\.09 GiB"):  # the H100 run's refusal
        SessionTable(4, budget, idle_ttl_s=300, retry_after_s=5).admit("s", vae.held, vae.working, reserve_only=True)
