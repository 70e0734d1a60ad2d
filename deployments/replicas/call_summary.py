"""The replica's model calls, logged as one `calls` line per interval instead of one per call.

Serve writes an access-log line per call between deployments (`CALL step OK 1830.2ms`): four
or five per chunk per session, which buried the session lines a person reads. Those of calls
that succeeded are DEBUG (deployments/log.py); in their place a replica that ran calls logs at
most one `calls` line per `interval_s`: how many by call name, their run seconds summed and the
longest, and how many sessions made them. The histograms (`lwf_call_seconds`) see every call;
slow ones have their own line (slow_calls.py).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

DEFAULT_INTERVAL_S = 60.0


class CallSummary:
    """Collects a replica's calls and logs them through `log.info("calls", fields=...)`."""

    def __init__(self, log: Any, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._interval_s = interval_s
        self._clock = clock
        self._reset(clock())

    def _reset(self, since: float) -> None:
        self._since = since  # the start of the interval the next line covers
        self._calls: Counter[str] = Counter()
        self._run_s: Counter[str] = Counter()
        self._sessions: set[str] = set()
        self._longest: tuple[float, str] = (0.0, "")  # run_s, call

    @property
    def pending(self) -> int:
        """Calls collected since the last line."""
        return sum(self._calls.values())

    def add(self, session: str, call: str, ran_s: float) -> None:
        """One call that ran `ran_s` seconds; logs the line when the interval has passed."""
        self._calls[call] += 1
        self._run_s[call] += ran_s
        self._sessions.add(session)
        self._longest = max(self._longest, (ran_s, call))
        self.flush()

    def flush(self) -> None:
        """Log what is pending once the interval has passed (called on each call and
        periodically by the replica, so a replica that went quiet still reports its last ones)."""
        now = self._clock()
        if now - self._since < self._interval_s:
            return
        if self.pending:
            run_s, call = self._longest
            self._log.info("calls", fields={
                "over_s": round(now - self._since, 1),
                "count": self.pending,
                "calls": ",".join(f"{name}:{n}" for name, n in sorted(self._calls.items())),
                "run_s": ",".join(f"{name}:{s:.2f}" for name, s in sorted(self._run_s.items())),
                "sessions": len(self._sessions),
                "max_run_s": round(run_s, 3), "max_run_call": call,
            })
        self._reset(now)
