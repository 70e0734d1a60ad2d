"""The whole graph: handshake, health and model card, and streaming == the offline pipeline."""
from __future__ import annotations

import asyncio

import numpy as np
import httpx
import torch

from camera import parse_size
from media.fmp4 import Fmp4Muxer
from model.pipeline import WorldPipeline
from protocol.messages import FrameReply

TEST_SIZE = "32*64"


def test_handshake_announces_the_served_model(connect):
    async def go():
        async with connect() as c:
            return c.config

    config = asyncio.run(go())
    assert config.model == "tiny"
    assert config.image_resolution == (32, 48)  # 16:9 at area 32*64 (spec B.1 by hand: lat 4 x 6)
    assert config.default_size == TEST_SIZE  # what the page computes a default session's size from
    assert config.intrinsics_resolution == (480, 832)
    assert (config.chunk_latent_frames, config.first_chunk_video_frames, config.chunk_video_frames) == (3, 9, 12)
    assert config.fps == 16 and config.video_codec == "h264" and config.protocol_version == 1
    assert config.needs_session_id and config.max_message_bytes == 12 * 1024 * 1024


def test_healthz_and_model_card(server):
    health = httpx.get(f"{server.http}/healthz", timeout=30)
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert set(health.json()) == {"status", "replicas", "sessions", "connections", "releasing", "probe_s", "line"}, \
        health.json()  # as README.md and docs/SERVING.md say
    assert health.json()["replicas"] == {"text_encoder": 1, "vae": 1, "dit": 2}
    card = httpx.get(f"{server.http}/v1/models", timeout=30).json()["data"][0]
    assert card["id"] == "tiny" and card["dtype"] == "float32" and card["device"] == "cpu"
    assert card["fp8"] is False and card["fp8_attention"] is False and card["kv_cache"] == "dtype"
    assert card["attention"] == "cudnn"
    assert card["default_size"] == TEST_SIZE and card["default_resolution"] == [32, 48]
    assert card["sessions"]["replicas"] == 2 and card["sessions"]["capacity"] == 4
    assert card["limits"]["max_num_frames"] == 4093  # AppArgs.sessions.max_frames reaches the codec


def test_streaming_equals_the_offline_pipeline(connect, example):
    """A client that declares num_frames and translation_scale and sends the slices
    poses[12k:12k+12] gets exactly the offline run (same tiny weights, seed 42)."""

    async def go():
        async with connect() as c:
            replies = await c.run_session("offline", example)
            await c.reset("offline")
        return replies

    replies = asyncio.run(go())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the replicas (fractional num_cpus -> 1 thread): same float order
    try:
        pipe = WorldPipeline.load()
        result, _ = pipe.generate(example.image_rgb(), example.prompt, example.poses, example.intrinsics,
                                  frame_num=example.num_frames, max_area=parse_size(TEST_SIZE))
    finally:
        torch.set_num_threads(threads)
    assert result.frames.shape == (33, 32, 48, 3)
    muxer = Fmp4Muxer(48, 32, 16)
    bounds = np.cumsum([0, 9, 12, 12])
    offline = [muxer.add_chunk(result.frames[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert all(isinstance(r, FrameReply) for r in replies)
    assert [r.video for r in replies] == offline
