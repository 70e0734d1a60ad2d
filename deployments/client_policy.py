"""ClientPolicy: the per-WebSocket limits against abusive or broken clients (AppArgs.connection).

* a token bucket on client frames (`max_messages_per_s`, `message_burst`): a flood is closed;
* silence: the first complete frame must come within `first_message_timeout_s` of the accept
  (a client that connects and sends nothing, or dribbles a frame in byte by byte, holds one of
  the ingress's `max_ongoing_requests` slots), later ones within `idle_timeout_s` of the last
  frame or reply while no chunk is in flight;
* replies queued unsent beyond `max_unsent_replies` (a client that does not read, where the
  transport blocks).

Each violation is a reason for a policy close (1008). Pure bookkeeping: the connection asks.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional

from deployments.config import ConnectionArgs
from deployments.quotas import TokenBucket


class ClientPolicy:
    """Tracks one socket's frames and replies against its limits."""

    def __init__(self, args: ConnectionArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self._args = args
        self._clock = clock
        self._rate = TokenBucket(args.max_messages_per_s, args.message_burst, clock)
        self._frames = 0
        self._last_activity = clock()  # the accept, then the last frame received or reply sent

    def wait_s(self, busy: bool) -> Optional[float]:
        """How long to wait for the next frame; None when the client has been silent too long.
        `busy`: chunks are in flight (the client waits for replies, it is not idle)."""
        limit = self._args.first_message_timeout_s if self._frames == 0 else self._args.idle_timeout_s
        if busy:
            return limit  # look again then
        left = self._last_activity + limit - self._clock()
        return left if left > 0 else None

    def silence_reason(self) -> str:
        if self._frames == 0:
            return f"no message within {self._args.first_message_timeout_s:g} s of connecting"
        return f"idle for {self._args.idle_timeout_s:g} s"

    def on_frame(self, unsent_replies: int) -> Optional[str]:
        """Count a frame; the reason to close the socket, or None."""
        self._frames += 1
        self._last_activity = self._clock()
        if self._rate.take():
            return f"more than {self._args.max_messages_per_s:g} messages per second; slow down"
        if unsent_replies >= self._args.max_unsent_replies:
            return "too many unread replies; read the replies"
        return None

    def on_reply(self) -> None:
        self._last_activity = self._clock()
