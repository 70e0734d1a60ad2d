"""PathProbe: is the path a session takes usable right now?

A replica that answers its stats can still be unreachable for sessions: its request slots
taken by calls that never end, or a router that no longer places calls. The probe routes one
cheap call to each deployment the way a session's calls go (the stateful ones with a session
id, through the session-affinity router), in a fresh request context, and waits for all of
them within a deadline. It never cancels a call (see lanes.py): a probe still on its way at
the deadline is counted as failed and left to finish.

It answers `/healthz` (load balancers, monitoring) and is deliberately not the ingress's Serve
health check: a DiT rolling out for minutes would then make Serve replace the ingress and drop
every socket and journal, which restarting the ingress cannot fix anyway.

Degraded: the path works but the waiting room (line/room.py) does not answer (its replica died
and is restarting): `/healthz` answers 200 with status `degraded`, not 503: sessions already
admitted stream, waiting ones keep their places (line/regain.py), and the room is the whole
application's, so taking this ingress replica out of a load balancer would fix nothing.
"""
from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from typing import Any, Optional

from deployments.ingress.detached import settle


def line_lost(line: Optional[dict[str, Any]]) -> bool:
    """The waiting room's stats (`WorldIngress._line`) say it did not answer: degraded."""
    return isinstance(line, dict) and "error" in line


class PathProbe:
    def __init__(self, backends: Any, timeout_s: float) -> None:
        self._b = backends
        self._timeout_s = timeout_s

    async def run(self) -> dict[str, float]:
        """Seconds each deployment took to answer; raises TimeoutError/RuntimeError when one
        did not answer in time or failed."""
        task = asyncio.get_running_loop().create_task(self._probe_all(), context=contextvars.Context())
        return await task

    async def _probe_all(self) -> dict[str, float]:
        key = f"__probe__~{uuid.uuid4().hex[:12]}"  # unknown to every replica: routed like a lost session
        calls = {
            "text_encoder": self._b.text.probe.remote(),
            "vae": self._b.vae.options(session_id=key).probe.remote(),
            "dit": self._b.dit.options(session_id=key).probe.remote(),
        }
        t0 = time.perf_counter()

        async def timed(name: str, call: Any) -> float:
            ended, result = await settle(call, self._timeout_s)
            if not ended:
                raise TimeoutError(f"{name} did not answer a routed probe within {self._timeout_s:g} s")
            if isinstance(result, BaseException):
                raise RuntimeError(f"{name} failed a routed probe: {type(result).__name__}: {result}")
            return round(time.perf_counter() - t0, 4)

        times = await asyncio.gather(*(timed(n, c) for n, c in calls.items()))
        return dict(zip(calls, times))
