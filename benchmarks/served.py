"""One synthetic session through a served app, as the serving benchmarks run it
(serve_load.py, line/arrivals.py, line/scenarios.py): connect, stream, reset, close; how it
ended is returned for the caller to record its way."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from client.session import WorldClient
from client.streaming import stream_session
from protocol.messages import Queued


@dataclass
class Streamed:
    """How one benchmark session ended (`stream_synthetic`)."""

    error: Optional[Exception] = None  # what ended it early (None: every chunk sent back and the reset answered)
    connected: bool = True  # False: `error` is the connect's
    reset_s: Optional[float] = None  # the final reset's round trip


async def stream_synthetic(url: str, api_key: Optional[str], sid: str, messages: list[bytes],
                           on_queued: Optional[Callable[[Queued], None]] = None, **stream: Any) -> Streamed:
    """Connect, stream `messages` (`stream_session`'s keywords `stream`), reset the session (it
    is freed now: a session closed without one waits resume_grace_s for a resume), close."""
    try:
        client = await WorldClient.connect(url, api_key=api_key)
    except Exception as e:  # noqa: BLE001 - the caller records it
        return Streamed(e, connected=False)
    client.on_queued = on_queued
    try:
        await stream_session(client, messages, **stream)
        t_reset = time.perf_counter()
        await client.reset(sid)
        return Streamed(reset_s=time.perf_counter() - t_reset)
    except Exception as e:  # noqa: BLE001 - the caller records it
        return Streamed(e)
    finally:
        await client.close()
