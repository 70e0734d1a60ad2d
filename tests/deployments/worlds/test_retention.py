"""The retention timer (deployments/ingress/worlds/retention.py): each ingress replica sweeps the
store every jittered `worlds.sweep_period_s`, deleting the worlds not updated for
`worlds.retention_days`, logged as one summary line per sweep; a store that fails is a warning
and the next period sweeps again."""
from __future__ import annotations

import asyncio
import logging
import time

from deployments.config import AppArgs
from deployments.ingress.worlds.keeping import open_keeping
from deployments.ingress.worlds.retention import RetentionSweeper
from deployments.log import get_log
from deployments.worlds.errors import WorldNotFound
from deployments.worlds.worlds import Worlds
from worlds_support import Switchable, save

DAY = 86400.0


def test_the_timer_deletes_worlds_past_their_retention_and_logs_a_summary(tmp_path, caplog):
    root = tmp_path / "worlds"
    old = Worlds(Switchable(root), clock=lambda: time.time() - 2 * DAY)  # updated two days ago
    _, stale = save(old, "alice", chunks=1)
    _, fresh = save(Worlds(Switchable(root)), "alice", chunks=1)
    args = AppArgs.model_validate({"worlds": {"enabled": True, "root": str(root), "retention_days": 1,
                                              "sweep_period_s": 0.1}})

    async def go() -> int:
        keeping = open_keeping(args, get_log("ingress"), sweeps=True)
        try:
            deadline = time.monotonic() + 20
            while keeping.sweeper.sweeps < 2:  # two periods: it goes on after the first
                assert time.monotonic() < deadline, "the retention timer did not sweep twice"
                await asyncio.sleep(0.05)
            return keeping.sweeper.deleted
        finally:
            await keeping.sweeper.close()

    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.ingress"):
        deleted = asyncio.run(go())
    assert deleted == 1
    listed = Worlds(Switchable(root)).list("alice")
    assert [m.world_id for m in listed] == [fresh.world_id]
    try:
        Worlds(Switchable(root)).load("alice", stale.world_id)
        raise AssertionError("the stale world is still there")
    except WorldNotFound:
        pass
    summaries = [r.getMessage() for r in caplog.records if "retention sweep" in r.getMessage()]
    assert summaries[0].startswith("world store retention sweep deleted=1 retention_days=1 seconds=")
    assert "deleted=0" in summaries[1]


def test_no_timer_without_a_retention_or_outside_a_replica(tmp_path):
    on = {"enabled": True, "root": str(tmp_path / "w")}

    async def go(worlds: dict, sweeps: bool):
        return open_keeping(AppArgs.model_validate({"worlds": worlds}), get_log("ingress"), sweeps=sweeps).sweeper

    assert asyncio.run(go(on, True)) is None  # no retention_days: worlds are kept until deleted
    assert asyncio.run(go({**on, "retention_days": 1}, False)) is None  # a test building the ingress class


def test_a_store_that_fails_is_a_warning_and_the_next_period_sweeps(tmp_path, caplog):
    store = Switchable(tmp_path / "worlds")
    _, stale = save(Worlds(store, clock=lambda: time.time() - 2 * DAY), "bob", chunks=1)
    sweeper = RetentionSweeper(Worlds(store, retention_s=DAY), 0.05, get_log("ingress"))

    async def go() -> tuple[int, int]:
        store.down = True
        sweeper.start()
        deadline = time.monotonic() + 20
        while sweeper.failures < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        store.down = False
        while sweeper.deleted < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await sweeper.close()
        return sweeper.failures, sweeper.deleted

    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.ingress"):
        failures, deleted = asyncio.run(go())
    assert failures >= 1 and deleted == 1
    assert any("sweep failed" in r.getMessage() and "error=store_unavailable" in r.getMessage()
               and r.levelno == logging.WARNING for r in caplog.records)
    assert Worlds(store).list("bob") == []


def test_each_period_is_jittered_by_a_fifth(tmp_path):
    worlds = Worlds(Switchable(tmp_path), retention_s=DAY)
    waits = [RetentionSweeper(worlds, 100.0, get_log("ingress"), rand=lambda r=r: r).next_wait_s()
             for r in (0.0, 0.5, 0.999999)]
    assert [round(w, 3) for w in waits] == [80.0, 100.0, 120.0]
