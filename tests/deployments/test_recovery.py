"""Session recovery: a session whose replica died or dropped it is rebuilt from the ingress's
journal and continues bit for bit (DiTEngine.restore in process; replicas killed in the app)."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
import numpy as np
import pytest
import torch

from model.factory import load_dit_engine, load_text_engine, load_vae_engine
from model.session import DiTSessionSpec, PastChunk
from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply

LONG_FRAMES = 57  # 5 chunks (12k - 3 frames)
KILL_CHUNKS = 4  # max_pending_chunks: all of them may be in flight at once


@pytest.mark.parametrize("window", [(-1, 0, None), (-1, 0, 15), (6, 3, None)],
                         ids=["open-ended", "planned-length", "rolling-window-with-sink"])
def test_restore_replays_the_cache_updates_bit_for_bit(example, window):
    """DiTEngine.restore over 3 stored chunks, then 2 more steps == the uninterrupted session."""
    local_attn_size, sink_size, total = window
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        text, vae = load_text_engine("tiny", None, "float32", "cpu"), load_vae_engine("tiny", None, "float32", "cpu")
        dit = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=local_attn_size, sink_size=sink_size)
        spec = DiTSessionSpec(context=text.encode(example.prompt), height=32, width=48, total_latent_frames=total)
        traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
        conditioning = vae.open(example.image_rgb(), 32, 48)
        session = dit.open(spec)
        past, reference = [], []
        for k in range(5):
            y = vae.condition(conditioning)
            poses, intrinsics = traj.chunk(k)
            latents = dit.step(session, y, poses, intrinsics).latents
            past.append(PastChunk(poses, intrinsics, y, latents))
            reference.append(latents)
            if k == 2:
                noise = session.noise.state()
        rebuilt = dit.restore(spec, past[:3], noise)
        assert rebuilt.chunk_index == 3 and rebuilt.caches.global_end == session.start_token * 3 // 5
        continued = [dit.step(rebuilt, c.y, c.poses, c.intrinsics).latents for c in past[3:]]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(continued, reference[3:]))


def _healthy_with(server, dit_replicas: int, timeout: float = 120.0) -> None:
    """Until /healthz answers 200 with `dit_replicas` DiT replicas (the controller replaced a killed one)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{server.http}/healthz", timeout=10)
        if r.status_code == 200 and r.json()["replicas"]["dit"] == dit_replicas:
            return
        assert time.monotonic() < deadline, f"not healthy again: {r.status_code} {r.text}"
        time.sleep(0.5)


def test_killing_the_dit_replica_mid_session_loses_nothing(server, connect, example, replica_killer):
    """Kill the DiT replica holding a session while its chunks are in flight: the session is
    rebuilt on the other replica and its video equals the uninterrupted run, byte for byte."""
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)

    async def go():
        async with connect() as c:
            reference = await c.run_session("reference", traj, chunks=KILL_CHUNKS)
            await c.reset("reference")
            for k in range(2):
                await c.infer("victim", traj, k, first=k == 0)
            replies = [await c.recv(), await c.recv()]
            holder = replies[-1].debug["dit_replica"]
            for k in range(2, KILL_CHUNKS):  # pipelined: chunk 2 is being stepped when the replica dies
                await c.infer("victim", traj, k, first=False)
            await asyncio.to_thread(replica_killer, "lwf", "DiTDeployment", holder)
            replies += [await c.recv() for _ in range(2, KILL_CHUNKS)]
            frames = c.videos["victim"].decode_frames()
            await c.reset("victim")
            expected = c.videos["reference"].decode_frames()
        return reference, replies, holder, frames, expected

    reference, replies, holder, frames, expected = asyncio.run(go())
    assert all(isinstance(r, FrameReply) for r in replies), replies
    assert [r.chunk_id for r in replies] == list(range(KILL_CHUNKS))
    assert [r.video for r in replies] == [r.video for r in reference]
    assert np.array_equal(frames, expected) and frames.shape[0] == 9 + 12 * (KILL_CHUNKS - 1)
    after = replies[2:]
    assert all(r.debug["recoveries"] == 1 and r.debug["dit_replica"] != holder for r in after)
    print(f"RELIABILITY dit-kill: faults=1 chunks={len(replies)} rebuilds={replies[-1].debug['recoveries']} lost=0")
    _healthy_with(server, dit_replicas=2)  # the controller replaced it: later tests have 4 slots again
    server.wait_held(0)


def test_the_recovery_drill_benchmark_kills_the_dit_replica_and_compares(server, replica_killer):
    """benchmarks/resume_drill.py --kill-app (run on the GPU by gpu_serve.sh, RECOVERY_DRILL=1)
    against the CPU app: it kills the DiT replica holding its session mid-session and the
    rebuilt session's chunks equal the reference's."""
    from benchmarks.resume_drill import main

    server.wait_held(0)
    result = main(["--url", server.ws, "--frames", "33", "--drop-after", "0", "--stores", "--kill-app", "lwf",
                   "--out", "/dev/null"])
    kill = result["kill"]
    assert set(result) >= {"kill"} and "store_off" not in result
    assert kill["chunks"] == 3 and kill["in_flight_at_kill"] == 1 and "DiTDeployment" in kill["killed"]
    assert kill["recoveries"] == 1 and kill["all_identical"] and kill["identical_chunks"] == 3, kill
    assert len(kill["frames_after_kill_s"]) == 2 and kill["frames_after_kill_s"] == sorted(kill["frames_after_kill_s"])
    _healthy_with(server, dit_replicas=2)
    server.wait_held(0)


def test_killing_the_vae_replica_mid_session_loses_nothing(server, connect, example, replica_killer):
    """The only VAE replica dies: the controller restarts it, the session's encoder and decoder
    caches and its H.264 encoder are rebuilt there by replay, and the fragments are identical."""
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)

    async def go():
        async with connect() as c:
            reference = await c.run_session("vae-reference", traj, chunks=4)
            await c.reset("vae-reference")
            for k in range(2):
                await c.infer("vae-victim", traj, k, first=k == 0)
            replies = [await c.recv(), await c.recv()]
            holder = replies[-1].debug["vae_replica"]
            await asyncio.to_thread(replica_killer, "lwf", "VaeDeployment", holder)
            for k in range(2, 4):
                await c.infer("vae-victim", traj, k, first=False)
            replies += [await c.recv(), await c.recv()]
            await c.reset("vae-victim")
        return reference, replies, holder

    reference, replies, holder = asyncio.run(go())
    assert all(isinstance(r, FrameReply) for r in replies), replies
    assert [r.video for r in replies] == [r.video for r in reference]
    # >= 1: waiting for the VAE's replacement may outlast the DiT's idle TTL (10 s here), then
    # the DiT side is rebuilt too.
    assert all(r.debug["vae_replica"] != holder and r.debug["recoveries"] >= 1 for r in replies[2:])
    print(f"RELIABILITY vae-kill: faults=1 chunks={len(replies)} rebuilds={replies[-1].debug['recoveries']} lost=0")
    _healthy_with(server, dit_replicas=2)
    server.wait_held(0)


def test_a_session_that_cannot_be_rebuilt_gets_session_lost(strict_server, strict_connect, api_keys, example):
    """The strict app's journal budget is below one image: once its idle TTL dropped the
    session, the next chunk is `session_lost` and the replicas hold nothing."""

    ttl = strict_server.sessions()["idle_ttl_s"]  # the strict app's, as its model card announces it

    async def go():
        async with strict_connect(api_keys[4]) as c:
            await c.infer("gone", example, 0, first=True)
            first = await c.recv()
            await asyncio.sleep(ttl + 1.0)  # the TTL + a sweep period (0.5 s) + margin; < the 7 s idle timeout
            await c.infer("gone", example, 1, first=False)
            lost = await c.recv()
        return first, lost

    first, lost = asyncio.run(go())
    assert isinstance(first, FrameReply)
    assert isinstance(lost, ErrorReply) and lost.code is ErrorCode.SESSION_LOST, lost
    assert "could not rebuild" in lost.message
    strict_server.wait_held(0)


def test_scaling_the_dit_down_drains_its_replica_and_rebuilds_its_sessions(server, connect, example, redeploy,
                                                                           replicas_of):
    """An in-place update (the app's config applied again with the same args and the DiT's
    `num_replicas` 2 -> 1 in `deployments:`) removes one of the two DiT replicas while two
    sessions (one on each) have chunks in flight: the removed replica finishes its call (graceful
    shutdown), the session it held is rebuilt on the other, both videos equal their uninterrupted
    runs, and no other replica is touched: the ingress keeps its WebSockets and journals.

    Placement is the router's (most free slots, ties at random, corrected by its own pins): the
    two sessions start together until they sit on different replicas (a few tries at most), so
    that the scale-down surely removes a replica holding one of them."""
    traj = dataclasses.replace(example, num_frames=LONG_FRAMES)
    seeds = (11, 12)
    tries = 5

    async def session(i: int, seed: int, barrier: asyncio.Barrier, homes: list, scale_down: asyncio.Event,
                      scaled: asyncio.Event) -> list:
        async with connect() as c:
            reference = await c.run_session(f"drain{i}-reference", traj, chunks=KILL_CHUNKS, seed=seed)
            await c.infer(f"drain{i}-reference", traj, KILL_CHUNKS, first=False, seed=seed)
            reference.append(await c.recv())
            await c.reset(f"drain{i}-reference")
            for attempt in range(tries):
                await barrier.wait()  # both replicas hold nothing of ours: the two open together
                sid = f"drain{i}-{attempt}"
                for k in range(2):
                    await c.infer(sid, traj, k, first=k == 0, seed=seed)
                replies = [await c.recv(), await c.recv()]
                assert all(isinstance(r, FrameReply) for r in replies), replies
                homes[i] = replies[1].debug["dit_replica"]
                await barrier.wait()
                if homes[0] != homes[1]:
                    break
                await c.reset(sid)  # one replica took both: start both again
            for k in range(2, KILL_CHUNKS):
                await c.infer(sid, traj, k, first=False, seed=seed)
            scale_down.set()
            replies += [await c.recv() for _ in range(2, KILL_CHUNKS)]
            # One chunk more once the replica is gone: the session it held must be rebuilt (the
            # chunks in flight may all finish before the drain on a fast machine).
            await scaled.wait()
            await c.infer(sid, traj, KILL_CHUNKS, first=False, seed=seed)
            replies.append(await c.recv())
            await c.reset(sid)
        return [reference, replies]

    async def go():
        events, barrier, homes = [asyncio.Event(), asyncio.Event()], asyncio.Barrier(2), [None, None]
        scaled = asyncio.Event()
        sessions = [asyncio.create_task(session(i, seed, barrier, homes, e, scaled))
                    for i, (seed, e) in enumerate(zip(seeds, events))]
        ready = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in events)))
        await asyncio.wait({ready, *sessions}, return_when=asyncio.FIRST_COMPLETED)
        for t in sessions:  # a session that failed before the scale-down fails the test now
            if t.done():
                t.result()
        await ready
        await asyncio.to_thread(redeploy, 1)
        scaled.set()
        return await asyncio.gather(*sessions), homes

    _healthy_with(server, dit_replicas=2)  # both DiT replicas up (the app may still be starting one)
    server.wait_held(0)
    before = replicas_of("lwf")
    try:
        results, homes = asyncio.run(go())
        after = replicas_of("lwf")
    finally:
        redeploy(2)
        _healthy_with(server, dit_replicas=2)
    assert {k: v for k, v in after.items() if k != "DiTDeployment"} == \
        {k: v for k, v in before.items() if k != "DiTDeployment"}, (before, after)
    assert len(after["DiTDeployment"]) == 1 and after["DiTDeployment"] < before["DiTDeployment"]
    assert homes[0] != homes[1], f"{tries} tries placed both sessions on one DiT replica"
    for reference, replies in results:
        assert all(isinstance(r, FrameReply) for r in replies), replies
        assert [r.video for r in replies] == [r.video for r in reference]
    rebuilt = sum(replies[-1].debug["recoveries"] > 0 for _, replies in results)
    assert rebuilt >= 1
    print(f"RELIABILITY drain: dit replicas 2 -> 1 with 2 sessions in flight, rebuilt={rebuilt}, lost=0")
    server.wait_held(0)
