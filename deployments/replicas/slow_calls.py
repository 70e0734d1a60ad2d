"""Slow model calls, logged as one summary line per interval instead of one line per call.

A call that runs longer than its deployment's `slow_call_s` is worth a line (a stall inside a
replica: a compile, allocator retries), but on a CPU every VAE call of the embedded model is
"slow" (issue 36: 89 WARNING lines in one session). So a replica logs the first slow call at
once, and after that at most one `slow calls` line per `interval_s`: how many, by call name,
the slowest one (session, run time), the longest wait for the compute lock, and the process
counters that moved during them, summed (`stall_counters`). The histograms
(`lwf_call_seconds`) still see every call.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Optional

DEFAULT_INTERVAL_S = 60.0


class SlowCalls:
    """Collects slow calls and logs them through `log.warning("slow calls", fields=...)`."""

    def __init__(self, log: Any, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._interval_s = interval_s
        self._clock = clock
        self._last_line: Optional[float] = None  # when the previous summary was logged
        self._reset()

    def _reset(self) -> None:
        self._since: Optional[float] = None  # the first pending call
        self._calls: Counter[str] = Counter()
        self._sessions: set[str] = set()
        self._counters: Counter[str] = Counter()
        self._slowest: tuple[float, str, str] = (0.0, "", "")  # run_s, call, session
        self._max_wait_s = 0.0

    @property
    def pending(self) -> int:
        """Slow calls collected since the last line."""
        return sum(self._calls.values())

    def add(self, session: str, call: str, waited_s: float, ran_s: float, moved: dict[str, int]) -> None:
        """One slow call; logs the summary when the interval since the last line has passed."""
        if self._since is None:
            self._since = self._clock()
        self._calls[call] += 1
        self._sessions.add(session)
        self._counters.update(moved)
        self._slowest = max(self._slowest, (ran_s, call, session))
        self._max_wait_s = max(self._max_wait_s, waited_s)
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Log what is pending if the interval has passed (or `force`); called on each slow
        call and periodically by the replica, so a quiet replica still reports its last ones."""
        now = self._clock()
        if not self.pending:
            return
        if not force and self._last_line is not None and now - self._last_line < self._interval_s:
            return
        run_s, call, session = self._slowest
        fields: dict[str, Any] = {
            "count": self.pending,
            "over_s": round(now - self._since, 1) if self._since is not None else 0.0,
            "calls": ",".join(f"{name}:{n}" for name, n in sorted(self._calls.items())),
            "sessions": len(self._sessions),
            "max_run_s": round(run_s, 3), "max_run_call": call, "max_run_session": session,
            "max_wait_s": round(self._max_wait_s, 3),
            **dict(sorted(self._counters.items())),
        }
        self._log.warning("slow calls", fields=fields)
        self._last_line = now
        self._reset()
