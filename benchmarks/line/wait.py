"""A benchmark session's wait in the server's line (issue 54, item 8).

A server with a waiting line answers a new session that finds every seat taken with `queued`
notices (docs/PROTOCOL.md, the waiting room) until its turn; the clients' `receive` skips them,
so a benchmark waits in line by itself, and `LineWait` records the wait: `queued_s`, from its
first notice to its first frame (the wait, then the session's own first chunk), 0 when it never
waited; the notices, the first position and ETA.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from protocol.messages import Queued


@dataclass
class LineWait:
    """One session's wait in the server's line: `notice` each `queued` notice (a `WorldClient`'s
    `on_queued`: `watch`), `served` at the session's first frame."""

    notices: int = 0
    positions: list[int] = field(default_factory=list)  # each notice's position, in order
    first_eta_s: Optional[float] = None
    first_at: Optional[float] = None
    served_at: Optional[float] = None

    def watch(self, client: Any) -> LineWait:
        client.on_queued = self.notice
        return self

    def notice(self, queued: Queued) -> None:
        if self.first_at is None:
            self.first_at, self.first_eta_s = time.perf_counter(), queued.eta_s
        self.notices += 1
        self.positions.append(queued.position)

    def served(self) -> None:
        """The session's first frame came: its wait (if any) is over."""
        if self.served_at is None:
            self.served_at = time.perf_counter()

    @property
    def seconds(self) -> float:
        if self.first_at is None:
            return 0.0
        return (self.served_at if self.served_at is not None else time.perf_counter()) - self.first_at

    def report(self) -> dict[str, Any]:
        return {"queued_s": round(self.seconds, 3), "notices": self.notices,
                "first_position": self.positions[0] if self.positions else None, "first_eta_s": self.first_eta_s}
