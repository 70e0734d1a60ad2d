"""PathProbe: one routed call per deployment within a deadline; a call that does not come back
fails the probe without being cancelled."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from deployments.ingress.health import PathProbe


class FakeHandle:
    """`handle.options(session_id=...).probe.remote()` answering after `delay` (None: never)."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.session_ids: list[str] = []
        self.cancelled = 0

    def options(self, session_id: str) -> "FakeHandle":
        self.session_ids.append(session_id)
        return self

    @property
    def probe(self):
        return SimpleNamespace(remote=self._call)

    async def _call(self) -> bool:
        try:
            await (asyncio.sleep(self.delay) if self.delay is not None else asyncio.Event().wait())
            return True
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def backends(dit_delay: float | None) -> SimpleNamespace:
    return SimpleNamespace(text=FakeHandle(0.0), vae=FakeHandle(0.01), dit=FakeHandle(dit_delay))


def test_a_path_that_answers_reports_its_times_and_routes_with_a_session_id():
    b = backends(0.02)
    times = asyncio.run(PathProbe(b, timeout_s=1.0).run())
    assert set(times) == {"text_encoder", "vae", "dit"} and times["dit"] >= 0.02
    assert b.vae.session_ids[0] == b.dit.session_ids[0] and b.dit.session_ids[0].startswith("__probe__~")


def test_a_wedged_deployment_fails_the_probe_at_its_deadline_without_cancelling_the_call():
    b = backends(None)

    async def go():
        probe = PathProbe(b, timeout_s=0.2)
        with pytest.raises(TimeoutError, match="dit did not answer"):
            await probe.run()
        return b.dit.cancelled

    assert asyncio.run(go()) == 0
