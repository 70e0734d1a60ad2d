"""Exact-prefix reuse through the serving graph (issue 33 part 1), on the app with the prefix
store on (conftest `prefix_server`: API keys, scope principal, PREFIX_MAX_MIB) and the replicas'
snapshots (PREFIX_SNAPSHOT_MIB): a session whose inputs repeat a stored prefix gets the stored
replies byte for byte (`cached: true`) without any replica holding it; one that leaves the prefix
at chunk k continues byte for byte like a session that never used the store, its state copied
from the snapshot of the session that computed the stored chunks; forks and rewinds copy
snapshots too; `prefix_cache: false` neither reads nor writes; one API key never sees another's
entries; the store stays within its byte budget."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from protocol.messages import Forked, FrameReply, Rewound
from protocol.codec import encode, validated
from protocol.messages import InferRequest, ForkRequest, RewindRequest, ControlRequest
from protocol.requests import SessionStart, infer_request

KEY, OTHER_KEY = "key-prefix", "key-prefix-2"  # conftest's API keys
OTHER = 2  # chunk 1 "takes another path": the poses of chunk 2 instead of its own


def chunk_sender(traj):
    """`await chunk(c, sid, k, p, **options)`: chunk k of `sid` with the cameras of chunk p, its frame."""
    async def chunk(c, sid: str, k: int, p: int, **options) -> FrameReply:
        poses, intrinsics = traj.chunk(p)
        await c.send(encode(validated(InferRequest, {"session_id": sid, "client_chunk_id": k, **options,
                                                     "cameras": {"poses": poses, "intrinsics": intrinsics}})))
        reply = await c.recv()
        assert isinstance(reply, FrameReply) and reply.chunk_id == k, reply
        return reply
    return chunk


def headers(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


class Run:
    """Sessions on `app`, each on a new socket (`connect_url`: conftest)."""

    def __init__(self, app, connect_url, traj) -> None:
        self.app, self.connect_url, self.traj = app, connect_url, traj
        self.ttfc = 0.0  # of the last session: seconds from its first send to its first reply
        self.held: dict | None = None  # of the last session served wholly from the store: replicas' sessions then

    def __call__(self, sid: str, poses: list[int], key: str = KEY, seed: int = 1, updates: dict[int, str] = {},
                 **first) -> list[FrameReply]:
        return asyncio.run(self._session(sid, poses, key, seed, updates, **first))

    async def _session(self, sid: str, poses: list[int], key: str, seed: int, updates: dict[int, str],
                       **first) -> list[FrameReply]:
        """Chunk k with the poses of chunk poses[k] (and the prompt update `updates[k]`), one at
        a time; its replies (reset after)."""
        app, traj = self.app, self.traj
        async with self.connect_url(app.ws, headers(key)) as c:
            replies = []
            t0 = time.perf_counter()
            for k, p in enumerate(poses):
                options = {"image": traj.image, "prompt": traj.prompt, "num_frames": traj.num_frames,
                           "translation_scale": traj.scale, "seed": seed, **first} if k == 0 else {}
                if k in updates:
                    options["prompt_update"] = updates[k]
                poses_p, intrinsics_p = traj.chunk(p)
                await c.send(encode(validated(InferRequest, {"session_id": sid, "client_chunk_id": k, **options,
                                                             "cameras": {"poses": poses_p,
                                                                         "intrinsics": intrinsics_p}})))
                reply = await c.recv()
                assert isinstance(reply, FrameReply) and reply.chunk_id == k and reply.client_chunk_id == k, reply
                replies.append(reply)
                if k == 0:
                    self.ttfc = time.perf_counter() - t0
            self.held = app.held() if all(cached(replies)) else None  # before the reset
            await c.reset(sid)
        return replies


def cached(replies: list[FrameReply]) -> list[bool]:
    """Which replies came from the store (`cached: true`; absent on a computed chunk)."""
    return [r.cached is True for r in replies]


def store_stats(app) -> dict:
    return httpx.get(f"{app.http}/healthz", headers=headers(), timeout=10).json()["prefix_cache"]


@pytest.fixture
def run(prefix_server, connect_url, example) -> Run:
    prefix_server.wait_held(0)
    yield Run(prefix_server, connect_url, example)
    prefix_server.wait_held(0)


def test_the_same_inputs_again_are_served_from_the_store_byte_for_byte(run):
    """A second session (another socket, another id) with the same inputs: the same replies'
    videos, `cached: true`, no replica holds it, its first chunk far sooner."""
    cold = run("cold", [0, 1, 2], seed=101)
    cold_ttfc = run.ttfc
    run.app.wait_held(0)
    hit = run("hit", [0, 1, 2], seed=101)
    assert cached(cold) == [False] * 3 and cached(hit) == [True] * 3
    assert [r.video for r in hit] == [r.video for r in cold]
    assert [(r.num_frames, r.mime_type, r.resolution) for r in hit] == [(r.num_frames, r.mime_type, r.resolution)
                                                                        for r in cold]
    assert all(r.session_id == "hit" for r in hit)
    assert run.held == {"vae": 0, "dit": 0}  # neither the VAE nor the DiT ever held it
    assert all(r.stage_durations["dit"] == 0 and r.stage_durations["vae_decode"] == 0 for r in hit)
    ratio = run.ttfc / cold_ttfc
    print(f"TTFC cold {cold_ttfc:.3f} s, from the store {run.ttfc:.3f} s (ratio {ratio:.3f}; issue 33: <= 0.2)")
    assert ratio <= 0.5  # loosely here (a loaded 2-core machine); benchmarks/branch_bench.py measures it


def test_a_session_that_leaves_the_prefix_continues_like_one_without_the_store(run):
    """Stored: chunks 0, 1, 2. Sessions that take another path at chunk 1 and at chunk 2 get the
    stored chunks before (cached) and then exactly the videos of sessions run with
    `prefix_cache: false` (materialised from the replicas' snapshots of "stored", closed since)."""
    stored = run("stored", [0, 1, 2], seed=102)
    before = store_stats(run.app)["materialised"].get("snapshot", 0)
    at_1 = run("at1", [0, OTHER, 2], seed=102)
    at_2 = run("at2", [0, 1, 0], seed=102)
    assert store_stats(run.app)["materialised"].get("snapshot", 0) == before + 2
    ref_1 = run("ref1", [0, OTHER, 2], seed=102, prefix_cache=False)
    ref_2 = run("ref2", [0, 1, 0], seed=102, prefix_cache=False)
    assert cached(at_1) == [True, False, False] and cached(at_2) == [True, True, False]
    assert not any(cached(ref_1 + ref_2))
    assert [r.video for r in at_1] == [r.video for r in ref_1]
    assert [r.video for r in at_2] == [r.video for r in ref_2]
    assert at_1[1].video != stored[1].video  # another path: other frames
    assert at_1[1].stage_durations["dit"] > 0
    # What the diverging sessions computed was stored in turn: their paths are served now.
    again = run("again", [0, OTHER, 2], seed=102)
    assert cached(again) == [True] * 3 and [r.video for r in again] == [r.video for r in ref_1]


def test_forks_and_rewinds_below_the_head_copy_the_replicas_snapshots(run, stats_of):
    """A session computed without the store, forked at chunk 1 and rewound to chunk 1: each is
    one `clone` of the snapshot after chunk 1 on each replica (no replay), and its next chunks
    equal a session's that took that path from the start."""
    traj = run.traj
    first = {"image": traj.image, "prompt": traj.prompt, "num_frames": traj.num_frames,
             "translation_scale": traj.scale, "seed": 110, "prefix_cache": False}
    ref = run("ref", [0, OTHER, 2], seed=110, prefix_cache=False)

    def clones() -> tuple[int, int]:
        return tuple(sum(s["calls"].get(name, 0) for s in stats_of("prefix", deployment))
                     for deployment, name in (("DiTDeployment", "clone"), ("VaeDeployment", "from_snapshot")))

    chunk = chunk_sender(traj)

    async def go():
        async with run.connect_url(run.app.ws, headers()) as c:
            for k in range(3):
                await chunk(c, "a", k, k, **(first if k == 0 else {}))
            before = await asyncio.to_thread(clones)
            await c.send(encode(ForkRequest(session_id="a", new_session_id="b", at_chunk=1)))
            forked = await c.recv()
            after_fork = [await chunk(c, "b", 1, OTHER), await chunk(c, "b", 2, 2)]
            at_fork = await asyncio.to_thread(clones)
            await c.send(encode(RewindRequest(session_id="a", to_chunk=1)))
            rewound = await c.recv()
            after_rewind = [await chunk(c, "a", 1, OTHER), await chunk(c, "a", 2, 2)]
            at_rewind = await asyncio.to_thread(clones)
            for sid in ("a", "b"):
                await c.reset(sid)
            return forked, after_fork, rewound, after_rewind, (before, at_fork, at_rewind)

    forked, after_fork, rewound, after_rewind, (before, at_fork, at_rewind) = asyncio.run(go())
    assert isinstance(forked, Forked) and forked.next_chunk_id == 1, forked
    assert isinstance(rewound, Rewound) and rewound.next_chunk_id == 1, rewound
    assert at_fork == (before[0] + 1, before[1] + 1) and at_rewind == (before[0] + 2, before[1] + 2)
    assert [r.video for r in after_fork] == [r.video for r in ref[1:]]
    assert [r.video for r in after_rewind] == [r.video for r in ref[1:]]


def test_prompt_updates_are_part_of_the_path(run):
    """A prompt update is a chunk's input: the same one is served, another one leaves the
    prefix there and continues like a session without the store (its text context replayed)."""
    snow = {1: "the same street under heavy snow"}
    stored = run("stored", [0, 1, 2], seed=106, updates=snow)
    again = run("again", [0, 1, 2], seed=106, updates=snow)
    rain = run("rain", [0, 1, 2], seed=106, updates={1: "the same street in the rain"})
    rain_ref = run("rainref", [0, 1, 2], seed=106, updates={1: "the same street in the rain"}, prefix_cache=False)
    plain = run("plain", [0, 1, 2], seed=106)
    assert cached(again) == [True] * 3 and [r.video for r in again] == [r.video for r in stored]
    assert cached(rain) == [True, False, False] and cached(plain) == [True, False, False]
    assert [r.video for r in rain] == [r.video for r in rain_ref]
    assert plain[1].video != stored[1].video  # no update: another chunk 1


def test_a_session_served_from_the_store_rewinds_and_forks_like_any(run):
    """Sessions served wholly from the store so far (no replica holds them) taken back to chunk
    1, or forked at chunk 2: the journal's replay rebuilds them, the chunks after are those of
    sessions that never used the store."""
    run("stored", [0, 1, 2], seed=107)
    ref_rewind = run("ref1", [0, OTHER, 2], seed=107, prefix_cache=False)
    ref_fork = run("ref2", [0, 1, 0], seed=107, prefix_cache=False)
    traj = run.traj
    first = {"image": traj.image, "prompt": traj.prompt, "num_frames": traj.num_frames,
             "translation_scale": traj.scale, "seed": 107}

    chunk = chunk_sender(traj)

    async def go():
        async with run.connect_url(run.app.ws, headers()) as c:
            served = [await chunk(c, "h", 0, 0, **first), await chunk(c, "h", 1, 1)]
            await c.send(encode(RewindRequest(session_id="h", to_chunk=1)))
            rewound = await c.recv()
            after_rewind = [await chunk(c, "h", 1, OTHER), await chunk(c, "h", 2, 2)]
            served += [await chunk(c, "g", 0, 0, **first), await chunk(c, "g", 1, 1), await chunk(c, "g", 2, 2)]
            await c.send(encode(ForkRequest(session_id="g", new_session_id="f", at_chunk=2)))
            forked = await c.recv()
            after_fork = await chunk(c, "f", 2, 0)
            for sid in ("h", "g", "f"):
                await c.reset(sid)
            return served, rewound, after_rewind, forked, after_fork

    served, rewound, after_rewind, forked, after_fork = asyncio.run(go())
    assert all(cached(served))
    assert isinstance(rewound, Rewound) and rewound.next_chunk_id == 1, rewound
    assert isinstance(forked, Forked) and forked.next_chunk_id == 2, forked
    assert [r.video for r in after_rewind] == [r.video for r in ref_rewind[1:]]
    assert after_fork.video == ref_fork[2].video


def test_key_driven_chunks_are_keyed_by_the_poses_the_keys_gave(run):
    """Chunks moved by the keys held (`from_keys`): the same keys again are served from the
    store (the frame's `poses` and `event_id` as a computed one's); other keys leave the prefix."""
    traj = run.traj
    first = SessionStart(traj.image, traj.prompt, seed=108)

    async def keyed(sid: str, keys: list[list[str]]) -> list[FrameReply]:
        async with run.connect_url(run.app.ws, headers()) as c:
            replies = []
            for k, held in enumerate(keys):
                await c.send(encode(ControlRequest(session_id=sid, event_id=k, keys=held)))
                await c.send(encode(infer_request(sid, from_keys=True, start=first if k == 0 else None,
                                                  client_chunk_id=k)))
                reply = await c.recv()
                assert isinstance(reply, FrameReply) and reply.chunk_id == k and reply.event_id == k, reply
                replies.append(reply)
            await c.reset(sid)
            return replies

    a = asyncio.run(keyed("a", [["w"], ["w", "j"]]))
    b = asyncio.run(keyed("b", [["w"], ["w", "j"]]))
    c = asyncio.run(keyed("c", [["w"], ["s"]]))
    c_again = asyncio.run(keyed("c2", [["w"], ["s"]]))  # what c computed was stored
    assert cached(a) == [False, False] and cached(b) == [True, True] and cached(c) == [True, False]
    assert cached(c_again) == [True, True] and c_again[1].video == c[1].video
    assert [r.video for r in b] == [r.video for r in a] and c[1].video != a[1].video
    assert all((x.poses == y.poses).all() for x, y in zip(a, b))


def test_prefix_cache_false_neither_reads_nor_writes(run):
    off = run("off", [0, 1], seed=103, prefix_cache=False)
    on = run("on", [0, 1], seed=103)  # nothing was written
    off_again = run("off2", [0, 1], seed=103, prefix_cache=False)
    on_again = run("on2", [0, 1], seed=103)
    assert not any(cached(off + on + off_again))  # off: not read either
    assert all(cached(on_again))
    assert [r.video for r in on] == [r.video for r in off] == [r.video for r in off_again] == [
        r.video for r in on_again]


def test_one_api_key_never_sees_another_keys_entries(run):
    mine = run("mine", [0, 1], seed=104)
    theirs = run("theirs", [0, 1], key=OTHER_KEY, seed=104)
    mine_again = run("mine2", [0, 1], seed=104)
    assert not any(cached(mine + theirs)) and all(cached(mine_again))
    assert [r.video for r in theirs] == [r.video for r in mine]


def test_the_store_stays_within_its_byte_budget_and_evicts_the_least_recently_used(run):
    """Sessions of new seeds until the store evicted the first one's chunks: it never holds
    more than max_mib; the most recent is still served, the first is computed again."""
    first = run("first", [0, 1, 2], seed=200)
    stats = store_stats(run.app)
    assert 0 < stats["bytes"] <= stats["max_bytes"]
    # Every node held now is older than what the next sessions store: once that many were
    # evicted, "first" is gone (least recently used first).
    goal, seed = stats["evictions"] + stats["entries"], 201
    while store_stats(run.app)["evictions"] < goal:
        assert seed < 300, f"not evicted after {seed - 200} sessions: {store_stats(run.app)}"
        run(f"fill{seed}", [0, 1, 2], seed=seed)
        assert store_stats(run.app)["bytes"] <= stats["max_bytes"]
        seed += 1
    latest = run("latest", [0, 1, 2], seed=seed - 1)
    again = run("again", [0, 1, 2], seed=200)
    assert all(cached(latest))  # the most recent one is still there
    assert not any(cached(again)) and [r.video for r in again] == [r.video for r in first]
    print(f"store after {seed - 200} sessions: {store_stats(run.app)}")


RESUME_APP = "prefixresume"


@pytest.fixture(scope="module")
def anonymous_resume_app(extra_app):
    """The store without API keys (scope: the client's address) and sessions resumable for 4 s."""
    app, _ = extra_app(RESUME_APP, sessions={"resume": {"grace_s": 4.0}}, dit={"num_replicas": 1},
                       prefix_cache={"max_mib": 1})
    yield app
    from ray import serve

    serve.delete(RESUME_APP)


def test_anonymous_clients_share_by_address_and_a_served_session_resumes(anonymous_resume_app, connect_url,
                                                                          example):
    """Without auth one address's sessions share the store. A session served from it (no
    replica holds it) whose socket dropped resumes on a new socket with its token: its next
    chunk, off the stored path, is rebuilt from its journal and equals a session's without the
    store."""
    app = anonymous_resume_app
    first = {"image": example.image, "prompt": example.prompt, "num_frames": example.num_frames,
             "translation_scale": example.scale, "seed": 109}

    chunk = chunk_sender(example)

    async def go():
        async with connect_url(app.ws) as c:
            stored = [await chunk(c, "a", 0, 0, **first), await chunk(c, "a", 1, 1)]
            await c.reset("a")
            ref = [await chunk(c, "ref", 0, 0, prefix_cache=False, **first), await chunk(c, "ref", 1, OTHER)]
            await c.reset("ref")
        async with connect_url(app.ws) as c:
            served = await chunk(c, "b", 0, 0, **first)
        async with connect_url(app.ws) as c:
            resumed = await chunk(c, "b", 1, OTHER, resume_token=served.resume_token, resume_from=1)
            await c.reset("b")
        return stored, ref, served, resumed

    app.wait_held(0)
    stored, ref, served, resumed = asyncio.run(go())
    assert cached(stored) == [False, False] and cached(ref) == [False, False]
    assert served.cached is True and served.video == stored[0].video and served.resume_token
    assert resumed.cached is not True and resumed.video == ref[1].video
    assert resumed.debug["recoveries"] >= 1  # rebuilt from the journal (no replica had held it)
    app.wait_held(0)
