"""Sizes and memory through the running strict app (buckets ["32*48", "48*32"], a 4096-pixel
output cap, a 12 MiB session budget, a 4096-token attention bound): the handshake lists the
buckets, every replica warmed them up in its constructor, sizes map to the nearest bucket,
out-of-bound requests get typed errors, and admission counts a session's whole footprint."""
from __future__ import annotations

from dataclasses import replace
import asyncio
import io

import httpx
import numpy as np
from PIL import Image

from model.factory import load_dit_engine
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import ErrorReply, FrameReply
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

MIB = 1024**2
STRICT_BUDGET_MIB = 12.0  # conftest.STRICT_ARGS
STRICT_ATTENTION_TOKENS = 4096
LENIENT = Limits(max_aspect_ratio=1000.0, max_output_area=2**30, max_num_frames=4093)  # let the client send what the server refuses


def png(h: int, w: int) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_buckets_are_announced_warmed_up_and_used(strict_server, strict_connect, api_keys, example, stats_of):
    card = httpx.get(f"{strict_server.http}/v1/models", headers={"Authorization": f"Bearer {api_keys[7]}"},
                     timeout=10).json()["data"][0]
    assert card["size_buckets"] == [[32, 48], [48, 32]] and card["default_resolution"] == [32, 48]
    for deployment in ("DiTDeployment", "VaeDeployment"):
        for stats in stats_of("strict", deployment):
            # warmed in the constructor; the warm-up left no session and no cache bytes behind
            assert stats["warmed_sizes"] == [[32, 48], [48, 32]] and stats["warmup_s"] > 0, stats
            assert stats["peak_memory_bytes"] > 0
    (dit,) = stats_of("strict", "DiTDeployment")
    assert dit["budget_bytes"] == int(STRICT_BUDGET_MIB * MIB) and dit["random_weights"] is False

    async def go():
        async with strict_connect(api_keys[7]) as c:
            sizes = c.config.size_buckets
            replies = []
            for sid, image in (("landscape", example.image), ("portrait", png(100, 60))):
                await c.send(encode(infer_request(sid, *example.chunk(0), start=SessionStart(image, example.prompt))))
                replies.append(await c.recv())
                await c.reset(sid)
        return sizes, replies

    sizes, replies = asyncio.run(go())
    assert sizes == ((32, 48), (48, 32))
    assert [r.resolution for r in replies] == [(32, 48), (48, 32)], replies


def test_out_of_bound_sizes_and_aspects_are_refused_with_typed_errors(strict_connect, api_keys, example):
    """Issue 12: a 16x4000 PNG gave a 48x15168 output that kept the VAE busy for minutes."""
    async def go():
        async with strict_connect(api_keys[7]) as c:
            out = []
            for sid, options in (("thin", {"image": png(16, 4000)}),
                                 ("big", {"image": example.image, "size": "64*112"})):
                start = SessionStart(options.pop("image"), example.prompt, **options)
                await c.send(encode(infer_request(sid, *example.chunk(0), start=start, limits=LENIENT)))
                out.append(await c.recv())
        return out

    thin, big = asyncio.run(go())
    assert isinstance(thin, ErrorReply) and thin.code is ErrorCode.BAD_IMAGE and "aspect" in thin.message
    assert isinstance(big, ErrorReply) and big.code is ErrorCode.TOO_LARGE and "4096" in big.message


def test_admission_counts_the_whole_footprint(strict_server, strict_connect, api_keys, example, stats_of):
    """A session of 2041 frames holds 8.4 MiB (KV + cross caches, noise plan, text); the 12 MiB
    budget takes one: the second gets busy (not an out-of-memory error), and a session beyond
    the attention bound gets too_large."""
    engine = load_dit_engine("tiny", None, "float32", "cpu")
    need = engine.footprint(32, 48, 510, 510)
    assert need.total < STRICT_BUDGET_MIB * MIB < need.held + need.total
    assert 6 * 510 <= STRICT_ATTENTION_TOKENS < 6 * 1023
    strict_server.wait_held(0)

    async def go():
        async with strict_connect(api_keys[8]) as a, strict_connect(api_keys[8]) as b:
            start = SessionStart(example.image, example.prompt, num_frames=2041)
            await a.send(encode(infer_request("first", *example.chunk(0), start=start, limits=LENIENT)))
            first = await a.recv()
            (held,) = await asyncio.to_thread(stats_of, "strict", "DiTDeployment")
            await b.send(encode(infer_request("second", *example.chunk(0), start=start, limits=LENIENT)))
            second = await b.recv()
            await b.send(encode(infer_request("long", *example.chunk(0), start=replace(start, num_frames=4093),
                                              limits=LENIENT)))
            long = await b.recv()
            await a.reset("first")
            await b.send(encode(infer_request("second", *example.chunk(0), start=start, limits=LENIENT)))
            admitted = await b.recv()
            await b.reset("second")
        return first, held, second, long, admitted

    first, held, second, long, admitted = asyncio.run(go())
    assert isinstance(first, FrameReply), first
    assert held["cache_bytes"] == need.held and held["reserved_bytes"] == need.total
    assert isinstance(second, ErrorReply) and second.code is ErrorCode.BUSY and second.retry_after_s > 0, second
    assert isinstance(long, ErrorReply) and long.code is ErrorCode.TOO_LARGE and "attend" in long.message, long
    assert isinstance(admitted, FrameReply), admitted
    strict_server.wait_held(0)
