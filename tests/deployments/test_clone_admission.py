"""DiTDeployment.clone / VaeDeployment.clone admission, without Ray (fake engines): a clone is
admitted like an open (slot and bytes), refused `busy` / `too_large` with nothing changed, and
answers `session_lost` for a source the replica does not hold, `Unsupported` where it cannot copy."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from media import Fmp4Muxer
from deployments.errors import Busy, SessionLost, TooLarge, Unsupported
from deployments.replicas.dit import DiTDeployment, DiTSlot
from deployments.replicas.priority_lock import PriorityLock
from deployments.replicas.session_table import SessionTable
from deployments.replicas.vae import VaeDeployment, VaeSlot
from deployments.wire import SessionOptions
from model.engine_api import EngineCapabilities, SessionFootprint
from model.session import SessionStatus

HELD, WORKING = 100, 10
OPTIONS = SessionOptions("s", "p", "d", (32, 48), 1, 6, None, (480, 832))


class FakeDiTEngine:
    capabilities = EngineCapabilities()

    def __init__(self) -> None:
        self.cloned: list = []

    @staticmethod
    def footprint(height, width, kv_frames, total_latent_frames) -> SessionFootprint:
        return SessionFootprint(HELD, WORKING)

    def clone(self, session):
        self.cloned.append(session)
        return SimpleNamespace(copy_of=session)


class _Counter:
    def inc(self) -> None:
        pass


def _host(cls, engine, max_sessions: int, budget: int):
    """A deployment's admission state (no Serve): its table, lock, metrics and log faked."""
    host = object.__new__(cls.func_or_class)
    host._engine = engine
    host._table = SessionTable(max_sessions, budget, idle_ttl_s=60.0, retry_after_s=1.5)
    host._lock = PriorityLock()
    host._replica = "r1"
    host._refused_total = 0
    host._metrics = SimpleNamespace(rejected=_Counter(), admitted=_Counter(), update=lambda *a: None,
                                    observe_call=lambda *a: None)
    host._log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    return host


def _dit(max_sessions: int = 2, budget: int = 10 * HELD):
    host = _host(DiTDeployment, FakeDiTEngine(), max_sessions, budget)
    session = SimpleNamespace(spec=SimpleNamespace(height=32, width=48, total_latent_frames=6),
                              status=SessionStatus.OPEN)
    host._table.admit("src", HELD, WORKING)
    host._table.add("src", DiTSlot(session, 32, 48, kv_frames=6, chunks=2))
    return host


def _state(host):
    t = host._table
    return t.keys(), t.bytes_in_use, t.reserved_bytes


def test_a_clone_is_admitted_like_an_open_and_copies_the_slot():
    host = _dit()
    assert asyncio.run(host.clone("src", "new", OPTIONS)) == "r1"
    new, src = host._table.get("new"), host._table.get("src")
    assert new.session.copy_of is src.session and (new.chunks, new.kv_frames) == (2, 6)
    assert host._table.bytes_in_use == 2 * HELD
    assert host.__dict__["_calls_total"] == {"clone": 1}


@pytest.mark.parametrize("max_sessions, budget, error", [(1, 10 * HELD, Busy), (2, HELD + WORKING + 5, Busy),
                                                         (2, HELD + WORKING - 1, TooLarge)])
def test_a_refused_clone_changes_nothing(max_sessions, budget, error):
    host = _dit(max_sessions)
    host._table.budget_bytes = budget  # TooLarge: below one session (the source came before it shrank)
    before = _state(host)
    with pytest.raises(error):
        asyncio.run(host.clone("src", "new", OPTIONS))
    assert _state(host) == before and host._engine.cloned == []


def test_a_clone_of_an_unknown_or_unclonable_source_is_typed():
    host = _dit()
    with pytest.raises(SessionLost):
        asyncio.run(host.clone("nobody", "new", OPTIONS))
    other_size = SessionOptions("s", "p", "d", (64, 48), 1, 6, None, (480, 832))
    with pytest.raises(Unsupported):
        asyncio.run(host.clone("src", "new", other_size))
    host._engine.capabilities = EngineCapabilities(clone=False)
    with pytest.raises(Unsupported):
        asyncio.run(host.clone("src", "new", OPTIONS))
    assert host._table.keys() == ["src"] and host._engine.cloned == []


def test_the_vae_clones_raw_frames_and_fmp4_sessions():
    """An fMP4 session's muxer is cloned with it (its state is counters: media/fmp4.py)."""
    engine = SimpleNamespace(clone=lambda s: SimpleNamespace(copy_of=s))
    host = _host(VaeDeployment, engine, 4, 10 * HELD)
    host._layout = SimpleNamespace(footprint=lambda h, w: SessionFootprint(HELD, WORKING))
    image = SimpleNamespace(height=32, width=48, status=SessionStatus.OPEN)
    muxer = Fmp4Muxer(48, 32)
    muxer.skip_chunk(9)
    for key, m in (("raw", None), ("fmp4", muxer)):
        host._table.admit(key, HELD, WORKING)
        host._table.add(key, VaeSlot(image, m))
    assert asyncio.run(host.clone("raw", "new")) == "r1"
    assert host._table.get("new").session.copy_of is image and host._table.get("new").muxer is None
    assert asyncio.run(host.clone("fmp4", "new2")) == "r1"
    copy = host._table.get("new2").muxer
    assert copy is not muxer and (copy.frames_done, copy.chunks_done) == (9, 1)
    copy.skip_chunk(12)
    assert (muxer.frames_done, muxer.chunks_done) == (9, 1)  # independent
    with pytest.raises(Busy):  # four slots: raw, fmp4, new and new2 held
        asyncio.run(host.clone("raw", "new3"))
    assert sorted(host._table.keys()) == ["fmp4", "new", "new2", "raw"]
