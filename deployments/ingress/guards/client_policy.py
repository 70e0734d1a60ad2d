"""ClientPolicy: the per-WebSocket limits against abusive or broken clients (AppArgs.connection).

* a token bucket on client frames (`max_messages_per_s`, `message_burst`) and one on their
  bytes (`max_bytes_per_s`, `bytes_burst`): a flood, of many small or of a few huge frames, is
  closed before it can fill the proxy's or the ingress's memory;
* refused frames: `max_refused_frames` frames in a row answered with an error (too large,
  malformed) close the socket; a client that keeps sending what the server refuses is broken
  or probing;
* silence: the first complete frame must come within `first_message_timeout_s` of the accept
  (a client that connects and sends nothing, or dribbles a frame in byte by byte, holds one of
  the ingress's `max_ongoing_requests` slots), later an infer within `idle_timeout_s` of the
  last infer or reply while no chunk is in flight (other frames, e.g. resets, do not keep an
  idle socket open);
* replies queued unsent beyond `max_unsent_replies` (a client that does not read, where the
  transport blocks).

Each violation is a reason for a policy close (1008). Pure bookkeeping: the connection asks.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional

from deployments.config import ConnectionArgs
from deployments.ingress.guards.quotas import TokenBucket


class ClientPolicy:
    """Tracks one socket's frames and replies against its limits."""

    def __init__(self, args: ConnectionArgs, max_message_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._args = args
        self._clock = clock
        self._rate = TokenBucket(args.max_messages_per_s, args.message_burst, clock)
        burst = args.bytes_burst if args.bytes_burst is not None else 2 * max_message_bytes
        self._bytes = TokenBucket(args.max_bytes_per_s, burst, clock)
        self._frames = 0
        self._refused_in_a_row = 0
        self._last_activity = clock()  # the accept, then the last infer received or reply sent

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
        return f"idle for {self._args.idle_timeout_s:g} s (no infer)"

    def on_frame(self, unsent_replies: int, nbytes: int = 0) -> Optional[str]:
        """Count a frame of `nbytes`; the reason to close the socket, or None."""
        self._frames += 1
        if self._frames == 1:
            self._last_activity = self._clock()
        if self._rate.take():
            return f"more than {self._args.max_messages_per_s:g} messages per second; slow down"
        if nbytes and self._bytes.take(nbytes):
            return (f"more than {self._args.max_bytes_per_s / 2**20:g} MiB per second sent (bursts up to "
                    f"{self._bytes.burst / 2**20:g} MiB); slow down")
        if unsent_replies >= self._args.max_unsent_replies:
            return "too many unread replies; read the replies"
        return None

    def on_outcome(self, refused: bool, infer: bool) -> Optional[str]:
        """The frame was answered with an error (`refused`) or accepted (an `infer` keeps the
        socket from idling); the reason to close the socket, or None."""
        if not refused:
            self._refused_in_a_row = 0
            if infer:
                self._last_activity = self._clock()
            return None
        self._refused_in_a_row += 1
        if self._refused_in_a_row >= self._args.max_refused_frames:
            return f"{self._refused_in_a_row} frames in a row were refused; fix the client"
        return None

    def on_reply(self) -> None:
        self._last_activity = self._clock()
