"""Failed resume claims cost their client, not the parking (one gate per ingress replica).

A claim (resume.py) takes one token of its client's bucket (the API key with auth on, else the
address) before it reaches the parking, and gives it back when the claim succeeds: only failed
claims spend. A bucket holds `burst` tokens and refills at `per_minute`. Once it is empty, a
claim waits in the ingress (its connection reads nothing meanwhile: the cost falls on the
claiming socket) until its turn, each waiting claim behind the previous one; a claim that would
wait longer than `MAX_WAIT_S` is not made (`busy`, with when to retry). So one client reaches
the parking with at most `burst` + `per_minute` failed claims a minute, however many sockets it
opens.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

MAX_WAIT_S = 30.0  # a claim never waits longer in the ingress; beyond it: busy
MAX_CLIENTS = 4096  # buckets kept (least recently used dropped: a dropped bucket is a full one)


@dataclass(slots=True)
class _Bucket:
    tokens: float  # may go below 0: claims waiting their turn
    at: float  # when `tokens` was last brought up to date


class ClaimGate:
    """Token buckets of failed claims, by client (no Ray, no sleeping: the caller waits)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, who: str, per_minute: float, burst: int) -> Optional[float]:
        """Take a token for a claim of `who`: the seconds to wait before making it (0: now), or
        None when that would be over MAX_WAIT_S (then nothing was taken: see `retry_in`)."""
        b = self._bucket(who, per_minute, burst)
        wait = max(0.0, (1.0 - b.tokens) * 60.0 / per_minute)
        if wait > MAX_WAIT_S:
            return None
        b.tokens -= 1.0
        return wait

    def retry_in(self, who: str, per_minute: float, burst: int) -> float:
        """Seconds until a claim of `who` would wait no longer than MAX_WAIT_S."""
        b = self._bucket(who, per_minute, burst)
        return max(0.0, (1.0 - b.tokens) * 60.0 / per_minute - MAX_WAIT_S)

    def give_back(self, who: str, burst: int) -> None:
        """The claim succeeded: its token returns (a successful resume costs nothing)."""
        b = self._buckets.get(who)
        if b is not None:
            b.tokens = min(float(burst), b.tokens + 1.0)

    def _bucket(self, who: str, per_minute: float, burst: int) -> _Bucket:
        now = self._clock()
        b = self._buckets.pop(who, None) or _Bucket(float(burst), now)
        b.tokens = min(float(burst), b.tokens + (now - b.at) * per_minute / 60.0)
        b.at = now
        self._buckets[who] = b  # most recently used last
        while len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        return b

    def __len__(self) -> int:
        return len(self._buckets)
