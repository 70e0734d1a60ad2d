"""BackgroundTask (deployments/worlds/background.py): the task the world writer and the retention
timer run; started once, cancelled and awaited by `close`, startable again after."""
from __future__ import annotations

import asyncio

from deployments.worlds.background import BackgroundTask


def test_start_is_idempotent_close_cancels_and_a_closed_task_starts_again():
    started: list[int] = []
    cancelled: list[int] = []

    async def loop() -> None:
        started.append(len(started))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(len(cancelled))
            raise

    async def go() -> list[str]:
        task = BackgroundTask(loop, "test-loop")
        await task.close()  # not started: nothing to do
        task.start()
        task.start()  # already running: no second task
        await asyncio.sleep(0.01)
        names = [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "test-loop"]
        await task.close()
        task.start()
        await asyncio.sleep(0.01)
        await task.close()
        return names

    names = asyncio.run(go())
    assert names == ["test-loop"]
    assert started == [0, 1] and cancelled == [0, 1]
