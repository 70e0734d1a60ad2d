"""A cancellation (the CLI's Ctrl-C) that comes as a reply arrives is never lost: the client's
reads time out with `asyncio.timeout`, not Python 3.11's `wait_for`, which returns the finished
read's result and drops the cancellation (the CLI then played the session to its end)."""
from __future__ import annotations

import asyncio

import pytest

from client.session import WorldClient
from protocol import ResetOk
from protocol.codec import encode


class CancellingSocket:
    """A socket whose frame is ready at once and whose read cancels the reading task first (a
    SIGINT handled by asyncio.run in the same loop iteration as the frame's arrival)."""

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task

    async def send(self, data: bytes) -> None:
        pass

    async def recv(self) -> bytes:
        self.task.cancel()
        return encode(ResetOk(session_id="s"))


@pytest.mark.parametrize("read", ["receive", "reset"])
def test_a_cancellation_arriving_with_a_reply_reaches_the_caller(read):
    async def scenario() -> None:
        client = WorldClient(CancellingSocket(asyncio.current_task()), config=None)  # type: ignore[arg-type]
        await client.send_reset("s")  # names the session the reply is for
        if read == "receive":
            await client.receive(timeout_s=5.0)
        else:
            await client.reset("s", timeout_s=5.0)
        await asyncio.sleep(0)  # the cancellation must surface here at the latest

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
