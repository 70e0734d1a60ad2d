"""Branches.fork's and .rewind's paths without Ray (fake deployment handles): at the head the
replicas holding the source clone it (routed by the source's key); a clone that fails for any
reason but busy / too_large falls back to the journal replay under a fresh key; busy refuses the
fork; below the head it replays, or, where the replicas keep snapshots, copies the snapshot
after k chunks (routed by its id), replaying when there is none."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from deployments.config import AppArgs
from deployments.errors import Busy, NoSnapshot, SessionLost, Unsupported
from deployments.ingress.history.branching import Branches
from deployments.ingress.journal import SessionJournal
from deployments.ingress.lanes import Lane, ReplicaLanes
from deployments.ingress.releases import Releases
from deployments.ingress.stream import Stream
from deployments.wire import NoiseSnapshot, SessionOptions
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import ErrorReply, ForkRequest, Forked, RewindRequest, Rewound

CHUNKS = 2


class FakeDeployment:
    """A handle whose calls are recorded as (method, session_id, first args) and answered by `answers`."""

    def __init__(self, calls: list, name: str, answers: dict) -> None:
        self._calls, self._name, self._answers, self._sid = calls, name, answers, None

    def options(self, session_id: str) -> "FakeDeployment":
        routed = FakeDeployment(self._calls, self._name, self._answers)
        routed._sid = session_id
        return routed

    def __getattr__(self, method: str):
        async def remote(*args):
            self._calls.append((self._name, method, self._sid, args[:2]))
            answer = self._answers.get(method, "r1")
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return SimpleNamespace(remote=remote)


class FakeReleases:
    def __init__(self, backends, dit_lane: Lane, vae_lane: Lane) -> None:
        self.failed: list[Stream] = []
        self._real = Releases(ReplicaLanes(backends, dit_lane, vae_lane, AppArgs(), None), None, None)

    def adopt(self, stream: Stream, replacing) -> None:
        pass

    def fail(self, stream: Stream) -> None:
        stream.fail()
        self.failed.append(stream)

    def retire(self, dit_key: str, vae_key: str) -> None:  # a rewind's old keys: closed on the lanes
        self._real.retire(dit_key, vae_key)


def _source(raw_frames: bool = False) -> Stream:
    journal = SessionJournal(np.zeros((8, 8, 3), np.uint8), 1 << 30)
    journal.set_context(np.ones((4, 8), np.float32))
    for k in range(CHUNKS):
        journal.add_chunk(np.zeros((12, 4, 4), np.float32), np.ones((12, 4), np.float32),
                          np.ones((20, 3, 2, 2), np.float32), np.full((16, 3, 2, 2), k, np.float32),
                          NoiseSnapshot(np.full(16, k, np.uint8), False), None)
        journal.conditioned += 1
        journal.decoded += 1
    spec = SessionOptions("A", "p", "d", (16, 16), 1, None, None, (480, 832), raw_frames)
    return Stream(spec, journal, journal.image, next_chunk=CHUNKS)


SNAPSHOTS = AppArgs(prefix_cache={"snapshot_mib": 16})


def _fakes(calls: list, logged: list, dit: dict, vae: dict) -> tuple[SimpleNamespace, SimpleNamespace]:
    """Backends whose DiT / VAE record their calls into `calls` and answer `dit` / `vae`, and a
    log that records into `logged`."""
    b = SimpleNamespace(dit=FakeDeployment(calls, "dit", dit), vae=FakeDeployment(calls, "vae", vae))
    log = SimpleNamespace(info=lambda msg, fields=None: logged.append((msg, fields)),
                          warning=lambda msg, fields=None: logged.append((msg, fields)))
    return b, log


def _fork(source: Stream, at: int, dit: dict = {}, vae: dict = {}, args: AppArgs = AppArgs(), rewind: bool = False):
    """Fork `source` at `at` into B (or rewind it to `at`) with the DiT / VAE answering `dit` /
    `vae`; (reply, calls, B (the source when rewound), log)."""
    calls: list = []
    logged: list = []

    async def go():
        b, log = _fakes(calls, logged, dit, vae)
        replies = SimpleNamespace(error=lambda code, message, sid, retry=None: ErrorReply(
            code=code, message=message, session_id=sid, retry_after_s=retry))
        dit_lane, vae_lane = Lane("dit"), Lane("vae")
        branches = Branches(ReplicaLanes(b, dit_lane, vae_lane, args, log), FakeReleases(b, dit_lane, vae_lane), replies)
        if rewind:
            return await branches.rewind(RewindRequest(session_id="A", to_chunk=at), source), source
        reply = await branches.fork(ForkRequest(session_id="A", new_session_id="B", at_chunk=at), source)
        return reply, branches._held.get("B")

    reply, forked = asyncio.run(go())
    return reply, calls, forked, logged


def _forked_log(logged, msg: str = "session forked") -> dict:
    return next(fields for m, fields in logged if m == msg)


def test_at_the_head_both_lanes_clone_an_fmp4_session():
    source = _source()
    reply, calls, b, logged = _fork(source, CHUNKS)
    assert isinstance(reply, Forked) and reply.next_chunk_id == CHUNKS
    assert ("dit", "clone", source.dit_key, (source.dit_key, b.dit_key)) in calls
    assert ("vae", "clone", source.vae_key, (source.vae_key, b.vae_key)) in calls
    assert [c[1] for c in calls if c[0] == "dit"] == ["clone"]  # no reserve, no restore
    assert [c[1] for c in calls if c[0] == "vae"] == ["clone"]
    assert (_forked_log(logged)["path"], _forked_log(logged)["vae_path"]) == ("clone", "clone")
    assert b.dit_admitted.done() and b.dit_admitted.exception() is None


def test_a_raw_frames_session_clones_on_both():
    source = _source(raw_frames=True)
    reply, calls, b, logged = _fork(source, CHUNKS)
    assert isinstance(reply, Forked)
    assert ("vae", "clone", source.vae_key, (source.vae_key, b.vae_key)) in calls
    assert "restore" not in [c[1] for c in calls]
    assert (_forked_log(logged)["path"], _forked_log(logged)["vae_path"]) == ("clone", "clone")


@pytest.mark.parametrize("error", [SessionLost("gone"), Unsupported("sequence parallel"), RuntimeError("died")])
def test_a_clone_that_cannot_be_made_falls_back_to_the_replay_under_a_fresh_key(error):
    source = _source()
    reply, calls, b, logged = _fork(source, CHUNKS, dit={"clone": error})
    assert isinstance(reply, Forked), reply
    clone = next(c for c in calls if c[0] == "dit" and c[1] == "clone")
    assert [c[1] for c in calls if c[0] == "dit"] == ["clone", "reserve", "restore"]
    replayed_on = {c[2] for c in calls if c[0] == "dit" and c[1] != "clone"}
    assert replayed_on == {b.dit_key} and b.dit_key != clone[3][1]  # a fresh key: the old one is pinned there
    assert _forked_log(logged)["path"] == "replay"


def test_a_busy_clone_refuses_the_fork():
    source = _source()
    reply, calls, b, _ = _fork(source, CHUNKS, dit={"clone": Busy("full", 1.5)})
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BUSY and reply.retry_after_s == 1.5
    assert [c[1] for c in calls if c[0] == "dit"] == ["clone"] and b is None


def test_below_the_head_it_replays():
    source = _source(raw_frames=True)
    reply, calls, _, logged = _fork(source, 1)
    assert isinstance(reply, Forked) and reply.next_chunk_id == 1
    assert "clone" not in [c[1] for c in calls]
    assert (_forked_log(logged)["path"], _forked_log(logged)["vae_path"]) == ("replay", "replay")


def _without_journal(source: Stream) -> Stream:
    """The source's journal outgrew its budget (sessions.journal_max_mib): it keeps nothing."""
    source.journal._keep(2 << 30)
    assert not source.journal.recoverable and source.journal.chunks == []
    return source


def test_at_the_head_a_session_without_a_journal_still_forks_by_copy():
    """A long session's journal is dropped over journal_max_mib: it can still branch from its
    last chunk (the copy needs no journal), not below it."""
    source = _without_journal(_source())
    source.prompt = "steered since"
    reply, calls, b, logged = _fork(source, CHUNKS)
    assert isinstance(reply, Forked) and reply.next_chunk_id == CHUNKS
    assert sorted(c[:2] for c in calls) == [("dit", "clone"), ("vae", "clone")]
    assert b.prompt == "steered since" and b.journal.decoded == CHUNKS and not b.journal.recoverable
    with pytest.raises(ProtocolError) as refused:  # below the head: nothing to replay
        _fork(_without_journal(_source()), 1)
    assert refused.value.code is ErrorCode.TOO_LARGE


def test_without_a_journal_a_clone_that_cannot_be_made_refuses_the_fork():
    source = _without_journal(_source())
    reply, calls, b, _ = _fork(source, CHUNKS, dit={"clone": SessionLost("gone")})
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TOO_LARGE and "journal" in reply.message
    assert b is None and "restore" not in [c[1] for c in calls]


def test_below_the_head_with_snapshots_both_lanes_copy_the_snapshot_after_k_chunks():
    source = _source()
    reply, calls, b, logged = _fork(source, 1, args=SNAPSHOTS)
    assert isinstance(reply, Forked) and reply.next_chunk_id == 1
    dit_snap, vae_snap = f"{source.dit_key}#1", f"{source.vae_key}#1"
    assert [c for c in calls if c[0] == "dit"] == [("dit", "clone", dit_snap, (dit_snap, b.dit_key))]
    assert [c for c in calls if c[0] == "vae"] == [("vae", "clone", vae_snap, (vae_snap, b.vae_key))]
    assert (_forked_log(logged)["path"], _forked_log(logged)["vae_path"]) == ("snapshot", "snapshot")
    assert b.snapshot_ids(1) == (dit_snap, vae_snap) and b.snapshot_ids(2) == (f"{b.dit_key}#2", f"{b.vae_key}#2")


@pytest.mark.parametrize("error", [NoSnapshot("evicted"), Busy("full", 1.0)])
def test_a_snapshot_that_cannot_be_copied_is_replayed_elsewhere(error):
    """No snapshot kept (evicted, its replica gone), or its replica full: the journal replay,
    admitted like a new session wherever there is room."""
    source = _source()
    reply, calls, b, logged = _fork(source, 1, dit={"clone": error}, vae={"clone": error}, args=SNAPSHOTS)
    assert isinstance(reply, Forked), reply
    assert [c[1] for c in calls if c[0] == "dit"] == ["clone", "reserve", "restore"]
    assert [c[1] for c in calls if c[0] == "vae"] == ["clone", "restore"]
    assert (_forked_log(logged)["path"], _forked_log(logged)["vae_path"]) == ("replay", "replay")


def test_a_rewind_closes_the_session_and_copies_its_snapshot_under_new_keys():
    source = _source()
    old_dit, old_vae = source.dit_key, source.vae_key
    reply, calls, a, logged = _fork(source, 1, args=SNAPSHOTS, rewind=True)
    assert isinstance(reply, Rewound) and reply.next_chunk_id == 1 and a.next_chunk == 1
    assert a.dit_key != old_dit and a.vae_key != old_vae
    assert [c for c in calls if c[0] == "dit"] == [("dit", "close", old_dit, (old_dit,)),
                                                   ("dit", "clone", f"{old_dit}#1", (f"{old_dit}#1", a.dit_key))]
    assert [c for c in calls if c[0] == "vae"] == [("vae", "close", old_vae, (old_vae,)),
                                                   ("vae", "clone", f"{old_vae}#1", (f"{old_vae}#1", a.vae_key))]
    log = _forked_log(logged, "session rewound")
    assert (log["to_chunk"], log["path"], log["vae_path"]) == (1, "snapshot", "snapshot")
    assert a.snapshot_ids(1) == (f"{old_dit}#1", f"{old_vae}#1") and a.journal.decoded == 1


def test_a_rewind_without_snapshots_replays_and_to_chunk_0_never_copies():
    reply, calls, a, logged = _fork(_source(), 1, rewind=True)
    assert isinstance(reply, Rewound) and [c[1] for c in calls if c[0] == "dit"] == ["close", "reserve", "restore"]
    assert _forked_log(logged, "session rewound")["path"] == "replay"
    reply, calls, a, _ = _fork(_source(), 0, args=SNAPSHOTS, rewind=True)  # nothing to copy: an open
    assert isinstance(reply, Rewound) and "clone" not in [c[1] for c in calls]


def _leave_store(dit: dict = {}, vae: dict = {}, snapshots: bool = True):
    """A session the prefix store served 2 chunks (no replica holds it) computes its next: how it
    is materialised, with the DiT / VAE answering `dit` / `vae`; (calls, stream, log, counted)."""
    from deployments.ingress.prefix.reuse import PrefixReuse  # noqa: PLC0415

    calls: list = []
    logged: list = []
    counted: list = []

    async def go():
        b, log = _fakes(calls, logged, dit, vae)
        metrics = SimpleNamespace(count_materialised=counted.append)
        reuse = PrefixReuse(ReplicaLanes(b, Lane("dit"), Lane("vae"), SNAPSHOTS, log), None, "fp", "global",
                            SimpleNamespace(fps=16), metrics)
        stream = _source()
        stream.served_from_store()
        if snapshots:
            stream.journal.inherit_snapshots({1: ("S~1#1", "V~1#1"), 2: ("S~1#2", "V~1#2")})  # the stored chunks'
        reuse.computing(stream, None, open_new=lambda s: calls.append(("open_new",)))
        await asyncio.gather(stream.vae_open, stream.dit_open)
        await asyncio.sleep(0)  # the "leaves the prefix store" callback
        return stream

    stream = asyncio.run(go())
    return calls, stream, logged, counted


def test_a_session_leaving_the_store_copies_the_snapshot_its_last_stored_chunk_names():
    calls, stream, logged, counted = _leave_store()
    assert sorted(calls) == [("dit", "clone", "S~1#2", ("S~1#2", stream.dit_key)),
                             ("vae", "clone", "V~1#2", ("V~1#2", stream.vae_key))]
    assert _forked_log(logged, "session leaves the prefix store")["path"] == "snapshot" and counted == ["snapshot"]


@pytest.mark.parametrize("snapshots", [True, False])
def test_a_session_leaving_the_store_replays_without_a_snapshot(snapshots):
    """None kept any more (evicted: NoSnapshot), or none named: the journal's replay."""
    error = NoSnapshot("evicted")
    calls, stream, logged, counted = _leave_store(dit={"clone": error}, vae={"clone": error}, snapshots=snapshots)
    for lane, replay in (("dit", ["reserve", "restore"]), ("vae", ["restore"])):
        assert [c[1] for c in calls if c[0] == lane and c[1] != "clone"] == replay
    assert ("clone" in [c[1] for c in calls]) is snapshots
    assert counted == ["replay"] and _forked_log(logged, "session leaves the prefix store")["vae_path"] == "replay"
