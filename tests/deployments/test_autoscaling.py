"""Serve autoscaling of the DiT by held sessions, on a real Serve app (`autoscaled_server`: one
session slot per DiT replica, 1..2 replicas, deployments/autoscaling_policy.py).

Scale-up: a second session is answered `busy`; the policy adds a replica and the session,
retried, lands there. Two sessions held with no chunk in flight keep both replicas (request
rate is zero). Scale-down: one session ends; Serve removes a replica (the newest: the one that
holds the other session, mid-stream), which takes no new calls; that session's next chunk is
rebuilt on the remaining replica by journal replay and its video equals the uninterrupted one.
"""
from __future__ import annotations

import asyncio
import time

from protocol.errors import ErrorCode
from protocol.messages import ErrorReply, FrameReply

HOLD_S = 4.0  # > look_back_period_s + downscale_delay_s of the app: what a request-rate policy would not survive


def dit_replicas() -> dict[str, int]:
    """Replica states of the autoscaled app's DiT (e.g. {"RUNNING": 2})."""
    from ray import serve

    states = serve.status().applications["auto"].deployments["DiTDeployment"].replica_states
    return {str(getattr(k, "value", k)): v for k, v in states.items() if v}


def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {dit_replicas()}"
        time.sleep(0.25)
    return value


def test_held_sessions_scale_the_dit_up_and_a_scale_down_drains_by_replay(autoscaled_connect, example):
    connect = autoscaled_connect
    until(lambda: dit_replicas() == {"RUNNING": 1}, 60, "one DiT replica")

    async def go():
        async with connect() as a, connect() as b:
            await a.infer("a", example, 0, first=True)
            first_a = await a.recv()
            assert isinstance(first_a, FrameReply), first_a
            await b.infer("b", example, 0, first=True)
            refused = await b.recv()  # the only slot is taken: admission answers busy ...
            assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.BUSY, refused
            t_busy = time.monotonic()
            await asyncio.to_thread(until, lambda: dit_replicas() == {"RUNNING": 2}, 120, "a second DiT replica")
            scaled_up_s = time.monotonic() - t_busy  # ... and the policy adds a replica
            for _ in range(40):  # the retried session lands on the new replica
                await b.infer("b", example, 0, first=True)
                first_b = await b.recv()
                if isinstance(first_b, FrameReply):
                    break
                assert first_b.code is ErrorCode.BUSY, first_b
                await asyncio.sleep(0.5)
            assert isinstance(first_b, FrameReply), first_b
            assert first_b.debug["dit_replica"] != first_a.debug["dit_replica"]

            await asyncio.sleep(HOLD_S)  # both sessions idle between chunks: no request in flight
            assert dit_replicas() == {"RUNNING": 2}, "held sessions must keep their replicas"

            reference = [first_a]
            for k in (1, 2):
                await a.infer("a", example, k, first=False)
                reference.append(await a.recv())
            await b.infer("b", example, 1, first=False)
            drained = [first_b, await b.recv()]
            await a.reset("a")  # a's replica is empty now: one replica holds all that is left
            t_end = time.monotonic()
            await asyncio.to_thread(until, lambda: dit_replicas() == {"RUNNING": 1}, 120, "the scale-down")
            scaled_down_s = time.monotonic() - t_end
            await b.infer("b", example, 2, first=False)  # b's replica was removed: rebuilt by replay
            drained.append(await b.recv())
            await b.reset("b")
        return reference, drained, scaled_up_s, scaled_down_s

    reference, drained, up_s, down_s = asyncio.run(go())
    assert all(isinstance(r, FrameReply) for r in reference + drained), reference + drained
    assert [r.video for r in drained] == [r.video for r in reference]  # nothing lost: byte-identical
    assert drained[-1].debug["recoveries"] >= 1, "the removed replica held b: it was rebuilt elsewhere"
    assert drained[-1].debug["dit_replica"] == reference[-1].debug["dit_replica"]
    print(f"RELIABILITY autoscaling: busy -> 2 DiT replicas in {up_s:.1f} s; a session ended -> 1 replica "
          f"in {down_s:.1f} s; the drained session rebuilt by replay, video identical")


def test_the_autoscale_benchmark_times_a_replica_the_autoscaler_starts(autoscaled_server, tmp_path):
    """benchmarks/autoscale_ready.py (run on the GPU by gpu_serve.sh AUTOSCALE=1) against the CPU
    app: A takes the one slot, B is answered `busy`, the policy starts a second DiT replica, B's
    retried infer lands there; the new replica's ready record is placed after the `busy`."""
    import json

    from benchmarks.autoscale_ready import main as bench_main

    out = tmp_path / "autoscale.json"
    assert bench_main(["--url", autoscaled_server.ws, "--retry-s", "0.25", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["new_replica"]["replica"] != r["first_replica"]["replica"]
    assert r["tries"] >= 2  # the first answer was `busy`
    assert 0 < r["busy_to_constructor_s"] < r["busy_to_ready_s"] <= r["busy_to_first_frame_s"]
    assert r["constructor_s"]["new"] > 0 and r["constructor_s"]["first"] > 0
    assert r["new_replica"]["load_s"] >= 0 and "warmup_per_size" in r["new_replica"]
