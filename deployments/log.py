"""Structured logs: every line ends with `key=value` fields (session, replica, chunk ...).

Loggers hang under "ray.serve" so Serve writes them into the replica's log files.
"""
from __future__ import annotations

import logging
from typing import Any


class KeyValueLog(logging.LoggerAdapter):
    """A logger adapter that appends its fields (and per-call `fields=`) as key=value."""

    def process(self, msg: Any, kwargs: Any):
        fields = {**self.extra, **kwargs.pop("fields", {})}
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        return (f"{msg} {tail}" if tail else msg), kwargs

    def bind(self, **fields: Any) -> "KeyValueLog":
        """A child adapter with more fixed fields (e.g. session_id)."""
        return KeyValueLog(self.logger, {**self.extra, **fields})


def get_log(component: str, **fields: Any) -> KeyValueLog:
    """The structured logger of one component (`ray.serve.lwf.<component>`)."""
    return KeyValueLog(logging.getLogger(f"ray.serve.lwf.{component}"), fields)
