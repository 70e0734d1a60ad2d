"""Pace: the message-rate bound of one viewer socket on the watch route (`sharing.viewer_messages_per_s`).

The camera route's sockets have theirs (guards/client_policy.py); a viewer's socket (viewer.py)
has its own, counted before a message is decoded: at most `viewer_messages_per_s` a second,
`viewer_message_burst` at once. A message over it is not read: its answer is `busy` with
`retry_after_s` (the seconds until the bucket holds one again; nothing was done). A socket
that keeps flooding is closed (1008, the camera route's "more than N messages per second;
slow down"): each message over the bound is a strike; `FORGIVEN_PER_S` strikes a second are
forgiven, and the strike past `MAX_STRIKES` unforgiven closes the socket. Key driving (a page
sends a `control` per key change) stays far below the default 30 a second.

Pure bookkeeping, no Ray and no awaits: the viewer's socket asks per message.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from deployments.ingress.guards.quotas import TokenBucket
from deployments.share_args import SharingArgs

MAX_STRIKES = 16  # messages over the bound, unforgiven, that a socket may send before it is closed
FORGIVEN_PER_S = 1.0  # strikes forgiven a second (a client that overshoots now and then is not closed)


@dataclass(frozen=True, slots=True)
class OverPace:
    """A message over the bound: its `busy` answer (`message`, `retry_after_s`) and whether the
    socket is closed now (`close`: the reason)."""

    message: str
    retry_after_s: float
    close: str | None = None


class Pace:
    """One viewer socket's message rate (module doc)."""

    def __init__(self, args: SharingArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_s = args.viewer_messages_per_s
        self._messages = TokenBucket(args.viewer_messages_per_s, args.viewer_message_burst, clock)
        self._strikes = TokenBucket(FORGIVEN_PER_S, MAX_STRIKES, clock)
        self.over = 0  # messages over the bound so far

    def take(self) -> OverPace | None:
        """Count one message: None when it may be read, else what it gets (class doc)."""
        wait = self._messages.take()
        if not wait:
            return None
        self.over += 1
        limit = f"more than {self._per_s:g} messages per second"
        close = f"{limit}; slow down" if self._strikes.take() else None
        return OverPace(f"{limit} on the watch route; this one was not read (nothing was done): slow down and "
                        f"send it again in {wait:.2f} s", wait, close)
