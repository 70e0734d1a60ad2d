"""Recovery stops rebuilding a session whose client reset it or left (no Ray)."""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from deployments.config import SessionArgs
from deployments.errors import Busy, SessionLost
from deployments.ingress.journal import SessionJournal
from deployments.log import KeyValueLog
from deployments.ingress.history.recovery import Recovery
from deployments.ingress.stream import Stream, StreamState
from deployments.wire import SessionOptions

IMAGE = np.zeros((16, 16, 3), np.uint8)
SPEC = SessionOptions(session_id="s", prompt="p", image_digest="d", resolution=(32, 48), seed=1,
                      total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))


class Metrics:
    def __init__(self) -> None:
        self.recoveries: list[tuple[str, bool]] = []

    def count_recovery(self, component: str, rebuilt: bool) -> None:
        self.recoveries.append((component, rebuilt))


def test_a_rebuild_waiting_for_room_gives_up_once_its_stream_is_closed():
    metrics = Metrics()
    recovery = Recovery(None, None, SessionArgs(recovery_timeout_s=60.0), KeyValueLog(logging.getLogger("t"), {}),
                        metrics)
    stream = Stream(SPEC, SessionJournal(IMAGE, max_bytes=1 << 20), IMAGE)
    calls = []

    async def restore() -> str:
        calls.append(1)
        if len(calls) == 2:
            stream.close()  # the socket ended while the rebuild waited
        raise Busy("full", 0.01)

    async def go():
        with pytest.raises(SessionLost):
            await recovery._until_placed("vae", stream, RuntimeError("lost"), restore)

    asyncio.run(go())
    assert len(calls) == 2  # no call after the close, long before the 60 s timeout
    assert metrics.recoveries == [("vae", False)]
