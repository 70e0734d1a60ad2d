"""Rate limits: a token bucket, and the per-API-key quotas of one ingress replica.

`TokenBucket` caps a connection's message rate (`connection.max_messages_per_s`) and a key's
chunk rate (`auth.chunks_per_minute`). `KeyQuota` also caps the sessions a key holds at once
(`auth.max_sessions_per_key`), over all of its connections to this ingress replica. With N
ingress replicas a key may use up to N times its quota (the counts are not shared).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional

from deployments.config import AuthArgs
from deployments.errors import Busy

SECONDS_PER_MINUTE = 60.0
SESSION_QUOTA_RETRY_S = 1.0  # retry hint when a key holds all the sessions it may


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up; `take` spends one."""

    def __init__(self, rate_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, n: float = 1.0) -> float:
        """Spend `n` tokens: 0.0 when there were, else the seconds until there are (none spent).
        More than `burst` at once is never possible: a wait of inf."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return 0.0
        return float("inf") if n > self.burst else (n - self._tokens) / self.rate_per_s


class KeyQuota:
    """Chunks per minute and concurrent sessions of one API key (on this ingress replica)."""

    def __init__(self, chunks_per_minute: Optional[int], max_sessions: Optional[int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._chunks = None if chunks_per_minute is None else TokenBucket(
            chunks_per_minute / SECONDS_PER_MINUTE, chunks_per_minute, clock)
        self._max_sessions = max_sessions
        self._sessions: set[str] = set()  # stream keys of the key's open sessions

    def take_chunk(self) -> None:
        """Count one infer; `Busy` (with the wait) beyond `chunks_per_minute`."""
        if self._chunks is None:
            return
        wait = self._chunks.take()
        if wait:
            limit = round(self._chunks.rate_per_s * SECONDS_PER_MINUTE)
            raise Busy(f"this API key sent its {limit} chunks per minute; retry in {wait:.1f} s", wait)

    def start_session(self, key: str, replacing: Optional[str] = None) -> None:
        """Count a new session (`replacing`: the session it closes, if any); `Busy` beyond the cap."""
        self.check_session(replacing)
        self._sessions = (self._sessions - {replacing}) | {key}

    def check_session(self, replacing: Optional[str] = None) -> None:
        """`Busy` when a new session (closing `replacing`) would exceed the cap; counts nothing."""
        held = self._sessions - {replacing}
        if self._max_sessions is not None and len(held) >= self._max_sessions:
            raise Busy(f"this API key holds {len(held)} sessions, the most it may; end one (reset or close "
                       "its socket) before starting another", SESSION_QUOTA_RETRY_S)

    def end_session(self, key: str) -> None:
        self._sessions.discard(key)


class Quotas:
    """The `KeyQuota` of each API key seen by this ingress replica."""

    def __init__(self, args: AuthArgs) -> None:
        self._args = args
        self._quotas: dict[str, KeyQuota] = {}

    def for_key(self, key_id: Optional[str]) -> Optional[KeyQuota]:
        """The quota of an authenticated key; None without keys or quotas."""
        args = self._args
        if key_id is None or (args.chunks_per_minute is None and args.max_sessions_per_key is None):
            return None
        if key_id not in self._quotas:
            self._quotas[key_id] = KeyQuota(args.chunks_per_minute, args.max_sessions_per_key)
        return self._quotas[key_id]
