"""A SessionHost without Ray or a model, for the tests of its call path: two sessions "a" and
"b" held, a metrics and a log stub that record what they get."""
from __future__ import annotations

from deployments.replicas import stall_counters
from deployments.replicas.priority_lock import PriorityLock
from deployments.replicas.session_host import SessionHost
from deployments.replicas.session_table import SessionTable


class _Metrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float]] = []

    def observe_call(self, call: str, waited_s: float, ran_s: float) -> None:
        self.calls.append((call, waited_s, ran_s))

    def update(self, sessions: int, cache_bytes: int, snapshot_bytes: int = 0, by_class=(0, 0)) -> None:
        pass


class _Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict]] = []

    def info(self, *args, **kwargs) -> None:
        pass

    def warning(self, msg: str, fields: dict) -> None:
        self.warnings.append((msg, fields))


def stub_host(slow_call_s: float) -> SessionHost:
    stall_counters.prime()  # as `_start_host` does (dynamo's first import is 1-3 s)
    host = object.__new__(SessionHost)
    host.slow_call_s = slow_call_s
    host._device = "cpu"
    host._table = SessionTable(8, None, idle_ttl_s=60.0, retry_after_s=1.0)
    host._lock = PriorityLock()
    host._metrics, host._log = _Metrics(), _Log()
    for key in ("a", "b"):
        host._table.admit(key, 1)
        host._table.start_building(key)
        host._table.add(key, key)
    return host
