"""SessionAffinityRouter: placement, pins, close and departed replicas (in-process, fake replicas),
then affinity through the running app: four concurrent sessions on two DiT replicas."""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.request_router import PendingRequest, ReplicaID

from deployments.router import SessionAffinityRouter
from protocol.messages import FrameReply

DEPLOYMENT = DeploymentID(name="DiTDeployment", app_name="test")


@dataclass
class FakeReplica:
    """The parts of RunningReplica the router reads."""

    replica_id: ReplicaID
    routing_stats: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 8

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def replica(name: str, keys: tuple[str, ...] = (), capacity: int = 2) -> FakeReplica:
    """A replica whose last stats report says it holds `keys`."""
    return FakeReplica(ReplicaID(unique_id=name, deployment_id=DEPLOYMENT),
                       {"sessions": len(keys), "capacity": capacity, "free_slots": capacity - len(keys),
                        "keys": list(keys)})


def request(session_id: str, method: str, args: tuple = ()) -> PendingRequest:
    meta = RequestMetadata(request_id="r", internal_request_id="i", call_method=method, session_id=session_id)
    return PendingRequest(args=list(args), kwargs={}, metadata=meta)


def make_router(replicas: list[FakeReplica], stats_fresh_s: float = 10.0) -> SessionAffinityRouter:
    router = SessionAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.REPLICA)
    router.initialize_state(pin_ttl_s=600.0, stats_fresh_s=stats_fresh_s)
    router.update_replicas(replicas)
    return router


async def route(router: SessionAffinityRouter, sid: str, method: str, args: tuple = ()) -> list[str]:
    """Names of the replicas the router offers (flattened ranks); then routed to the first."""
    pr = request(sid, method, args)
    ranks = await router.choose_replicas(list(router.curr_replicas.values()), pr)
    names = [r.replica_id.unique_id for rank in ranks for r in rank]
    assert pr.routing_context.should_backoff
    if names:  # Serve routes to a replica of the first rank
        router.on_request_routed(pr, ranks[0][0].replica_id, None)
    return names


def test_new_sessions_go_to_the_replica_with_most_free_slots_and_stay():
    async def go():
        router = make_router([replica("a", keys=("x",)), replica("b")])
        assert await route(router, "s1", "open") == ["b"]
        # b now holds s1 by this router's own count: a and b have one free slot each.
        second = await route(router, "s2", "open")
        third = await route(router, "s3", "open")
        assert sorted(second + third) == ["a", "b"]
        for method in ("condition", "step", "decode"):
            assert await route(router, "s1", method) == ["b"]

    asyncio.run(go())


def test_live_and_offline_sessions_are_placed_by_their_own_free_slots():
    """Replicas that bound `/v1/videos` jobs apart (max_offline_sessions) report them apart: a
    live session is placed by live slots (jobs take none of them), a job by the offline ones,
    and this router's own recent placements count in their class only."""
    from types import SimpleNamespace

    live, job = SimpleNamespace(offline=False), SimpleNamespace(offline=True)

    def with_jobs(name: str, keys: tuple[str, ...], jobs: tuple[str, ...]) -> FakeReplica:
        r = replica(name, keys=keys + jobs)
        r.routing_stats.update(offline_capacity=2, apart=list(jobs))
        return r

    async def go():
        router = make_router([with_jobs("a", (), ("j1", "j2")), with_jobs("b", ("x",), ())])
        assert await route(router, "s1", "reserve", ("s1", live)) == ["a"]  # a: 2 live slots free (its jobs take none), b: 1
        assert await route(router, "j3", "reserve", ("j3", job)) == ["b"]  # offline: a's 2 are taken, b has 2
        assert await route(router, "j4", "open", ("j4", job)) == ["b"]  # b: 1 offline slot left (j3, placed here)
        assert await route(router, "s2", "open", ("s2", live)) in (["a"], ["b"])  # 1 live each: the jobs count apart

    asyncio.run(go())


def test_without_an_offline_bound_every_session_takes_a_live_slot():
    from types import SimpleNamespace

    async def go():
        a, b = replica("a", keys=("j1", "j2"), capacity=3), replica("b", keys=("x",), capacity=3)
        a.routing_stats.update(offline_capacity=None, apart=[])
        router = make_router([a, b])
        assert await route(router, "s1", "open", ("s1", SimpleNamespace(offline=False))) == ["b"]  # a: 1 free, b: 2

    asyncio.run(go())


def test_concurrent_opens_spread_over_replicas():
    async def go():
        router = make_router([replica("a"), replica("b")])
        placed = [(await route(router, f"s{i}", "open"))[0] for i in range(4)]
        assert Counter(placed) == Counter({"a": 2, "b": 2})

    asyncio.run(go())


def test_a_session_its_replica_dropped_stops_taking_a_slot_once_the_stats_say_so():
    """A pin counts as a taken slot only until the stats could list it: sessions the replica
    dropped at its idle TTL (no close through this router) do not skew placement for the pins'
    whole life."""
    async def go():
        a, b = replica("a"), replica("b", capacity=0)  # b has not reported yet: both go to a
        router = make_router([a, b], stats_fresh_s=0.05)
        assert [(await route(router, s, "open"))[0] for s in ("s1", "s2")] == ["a", "a"]
        b.routing_stats = {**b.routing_stats, "capacity": 1}
        await asyncio.sleep(0.1)  # a's stats list neither any more (both expired there)
        assert await route(router, "s3", "open") == ["a"]  # a: 2 free, b: 1 (the pins no longer count)

    asyncio.run(go())


def test_closes_correct_stale_stats():
    async def go():
        # The last reports (stale): a holds x and y (full), b holds z and w (full).
        router = make_router([replica("a", keys=("x", "y")), replica("b", keys=("z", "w"))])
        await route(router, "z", "close")  # z's client reset through this router
        assert await route(router, "new", "open") == ["b"]  # b's z is gone, a is still full

    asyncio.run(go())


def test_close_frees_the_pin_and_unknown_sessions_go_anywhere():
    async def go():
        router = make_router([replica("a"), replica("b")])
        home = (await route(router, "s", "open"))[0]
        assert await route(router, "s", "close") == [home]
        # Unpinned and not an open: offered every replica (the holder-less replica answers session_lost).
        assert sorted(await route(router, "s", "step")) == ["a", "b"]
        assert sorted(await route(router, "", "stats")) == ["a", "b"]

    asyncio.run(go())


def test_a_session_another_router_placed_goes_to_the_replica_that_reports_it():
    """A session opened through another router (another ingress replica, a resumed session,
    the parking's expiry close): its first call here follows the replicas' stats, then the pin."""
    async def go():
        a, b = replica("a", keys=("x",)), replica("b", keys=("theirs", "y"))
        router = make_router([a, b])
        assert await route(router, "theirs", "step") == ["b"]
        b.routing_stats = {**b.routing_stats, "keys": ["y"]}  # a later report: the pin holds, not the stats
        assert await route(router, "theirs", "decode") == ["b"]
        assert await route(router, "theirs", "close") == ["b"]
        assert sorted(await route(router, "theirs", "step")) == ["a", "b"]  # closed, and no replica reports it

    asyncio.run(go())


def test_a_clone_goes_to_its_source_and_pins_the_new_key_there():
    """clone(source_key, new_key, ...) is routed by the source's key; the new key then follows it,
    even to the fuller replica, and counts as a slot taken there."""
    async def go():
        router = make_router([replica("a", capacity=3), replica("b", capacity=3)])
        home = (await route(router, "src", "open"))[0]
        assert await route(router, "src", "clone", ("src", "new", None)) == [home]
        for method in ("condition", "step", "close"):
            assert await route(router, "new", method) == [home]
        await route(router, "src2", "clone", ("src2", "lost", None))  # unknown source: any replica answers
        assert len(await route(router, "lost", "step")) == 1  # pinned where that clone went
        other = "b" if home == "a" else "a"
        await route(router, "src", "clone", ("src", "new2", None))
        assert await route(router, "next", "open") == [other]  # home holds src and new2

    asyncio.run(go())


def test_a_clone_from_a_snapshot_goes_where_its_session_is_or_was():
    """A snapshot id (`<key>#<chunks>`) routes by its session's pin, after its close by where the
    close went, else by the replicas' stats (`snapshots`), else anywhere; the new key is pinned."""
    async def go():
        r1, r2 = replica("a", capacity=3), replica("b", capacity=3)
        router = make_router([r1, r2])
        home = (await route(router, "s~1", "open"))[0]
        other = "b" if home == "a" else "a"
        await route(router, "x", "open")  # one session on each
        assert await route(router, "s~1#2", "clone", ("s~1#2", "f~1", None)) == [home]
        assert await route(router, "f~1", "step") == [home]
        await route(router, "s~1", "close")
        assert await route(router, "s~1#1", "clone", ("s~1#1", "g~1", None)) == [home]
        (r2 if other == "b" else r1).routing_stats["snapshots"] = ["t~9#3"]  # another router's session
        assert await route(router, "t~9#3", "clone", ("t~9#3", "h~1", None)) == [other]
        assert sorted(await route(router, "u~9#3", "clone", ("u~9#3", "i~1", None))) == ["a", "b"]
        assert await route(router, "s~1#1", "open") == [home]  # never placed like a session

    asyncio.run(go())


def test_departed_replica_drops_its_pins():
    async def go():
        a, b = replica("a"), replica("b", keys=("x", "y"))
        router = make_router([a, b])
        assert await route(router, "s", "open") == ["a"]
        router.update_replicas([b, replica("c")])  # a left (scale down / died and replaced)
        # The session is not re-placed on another replica by a later call.
        assert sorted(await route(router, "s", "step")) == ["b", "c"]
        assert await route(router, "t", "open") == ["c"]
        router.on_replica_actor_died(ReplicaID(unique_id="c", deployment_id=DEPLOYMENT))
        assert await route(router, "t", "step") == ["b"]

    asyncio.run(go())


def test_a_rebuilt_session_is_placed_like_a_new_one_and_stale_pins_go():
    async def go():
        a, b = replica("a", keys=("x",)), replica("b")
        router = make_router([a, b])
        assert await route(router, "s", "open") == ["b"]
        # b died: Serve dropped it from the routable set before telling this router.
        del router.curr_replicas[b.replica_id]
        assert await route(router, "s", "step") == ["a"]  # the stale pin is dropped, not followed
        assert await route(router, "s~2", "restore") == ["a"]  # a rebuild is placed and pinned
        assert await route(router, "s~2", "step") == ["a"]

    asyncio.run(go())


def test_four_concurrent_sessions_stick_to_their_replicas_and_match_solo_runs(server, connect, example):
    """Two DiT replicas, four sessions at once: every chunk of a session lands on one replica,
    the sessions spread 2 + 2, and each video equals the same session run alone."""
    seeds = [1, 2, 3, 4]

    async def run(sid: str, seed: int) -> list[FrameReply]:
        async with connect() as c:
            replies = await c.run_session(sid, example, seed=seed)
            await c.reset(sid)
        return replies

    async def solo():
        return [await run(f"solo{seed}", seed) for seed in seeds]

    async def together():
        return await asyncio.gather(*(run(f"duo{seed}", seed) for seed in seeds))

    server.wait_held(0)
    alone = asyncio.run(solo())
    concurrent = asyncio.run(together())
    homes = []
    for replies in concurrent:
        assert all(isinstance(r, FrameReply) for r in replies)
        replicas = {r.debug["dit_replica"] for r in replies}
        assert len(replicas) == 1, f"a session's chunks ran on {replicas}"
        homes.append(replicas.pop())
    assert sorted(Counter(homes).values()) == [2, 2]
    for solo_replies, together_replies in zip(alone, concurrent):
        assert [r.video for r in together_replies] == [r.video for r in solo_replies]
    assert len({alone[i][1].video for i in range(4)}) == 4  # the seeds matter

