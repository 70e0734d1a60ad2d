"""Structured logs: every line ends with `key=value` fields (session, replica, chunk ...).

Loggers hang under "ray.serve" so Serve writes them into the replica's log files.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

# A value printed bare: no spaces, quotes, '=', control characters or other line breaks. Anything
# else is printed as a JSON string (ASCII, escaped), so that a client's `session_id` holding
# "\n" or terminal escapes cannot forge a log line or a field.
_BARE = re.compile(r"[!#-<>-~]*")  # printable ASCII less space, '"' and '='


def _value(v: Any) -> str:
    text = str(v)
    return text if _BARE.fullmatch(text) else json.dumps(text, ensure_ascii=True)


class KeyValueLog(logging.LoggerAdapter):
    """A logger adapter that appends its fields (and per-call `fields=`) as key=value."""

    def process(self, msg: Any, kwargs: Any):
        fields = {**self.extra, **kwargs.pop("fields", {})}
        tail = " ".join(f"{k}={_value(v)}" for k, v in fields.items())
        return (f"{msg} {tail}" if tail else msg), kwargs

    def bind(self, **fields: Any) -> "KeyValueLog":
        """A child adapter with more fixed fields (e.g. session_id)."""
        return KeyValueLog(self.logger, {**self.extra, **fields})


def get_log(component: str, **fields: Any) -> KeyValueLog:
    """The structured logger of one component (`ray.serve.lwf.<component>`)."""
    return KeyValueLog(logging.getLogger(f"ray.serve.lwf.{component}"), fields)


class _TypedErrorsAsInfo(logging.Filter):
    """Serve logs every exception a replica method raises as ERROR with a traceback ("Request
    failed."). A typed `ReplicaError` (busy, session lost, chunk cap) is an answer to the
    client, not a fault: log it as one INFO line with its code."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        from deployments.errors import ReplicaError  # here: errors imports the protocol package

        if isinstance(exc, ReplicaError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = f"request answered with {exc.code.value}: {exc.message}", ()
            record.exc_info, record.exc_text = None, None
        return True


_TYPED_ERRORS_FILTER = _TypedErrorsAsInfo()


def log_typed_errors_as_info() -> None:
    """Install the filter on Serve's logger of this process (idempotent)."""
    logger = logging.getLogger("ray.serve")
    if _TYPED_ERRORS_FILTER not in logger.filters:
        logger.addFilter(_TYPED_ERRORS_FILTER)


# Serve's routine access-log lines: the health traffic, `GET /healthz 200 12.3ms` on the ingress
# (the client address may come first), the web page's files served (`GET / 200`, and `GET
# /{path:path} 200` for each of /static/'s: the proxy names the route by its route patterns, where
# the mount of /static/ is no pattern and the WebSocket catch-all is; 304 too), and every call
# between deployments that succeeded, `CALL step OK 1830.2ms` on the replicas (the /healthz
# probes' `CALL probe OK 0.4ms` / `CALL stats OK 1.1ms` among them). A failed call (`CALL step
# ERROR ...`), a file not found, and the ingress's other HTTP and WebSocket lines stay.
_ROUTINE_ACCESS = re.compile(r"(?:^|\s)(?:(?:GET|HEAD) \S*/healthz/? \S+|(?:GET|HEAD) (?:/|/static\S*|\S*/\{path:path\}) "
                             r"(?:200|304)|CALL \S+ OK) [\d.]+ms$")


class _RoutineAccessAtDebug(logging.Filter):
    """A load balancer probing `/healthz` every few seconds wrote four INFO lines per probe
    (issue 36), each page load ~15 `GET /{path:path} 200` lines (issue 57), and each chunk four
    or five `CALL ... OK` lines between the deployments, which buried the session lines. Serve's access-log records of both become DEBUG: dropped at the
    default INFO level, shown when the app's `logging_config.log_level` is DEBUG. Each replica
    logs a `calls` line per minute instead (deployments/replicas/call_summary.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "serve_access_log", False) or record.levelno != logging.INFO:
            return True
        if not _ROUTINE_ACCESS.search(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger("ray.serve").isEnabledFor(logging.DEBUG)


_ROUTINE_FILTER = _RoutineAccessAtDebug()


def log_routine_access_at_debug() -> None:
    """Install the filter on Serve's logger of this process (idempotent); every deployment
    calls it in its constructor."""
    logger = logging.getLogger("ray.serve")
    if _ROUTINE_FILTER not in logger.filters:
        logger.addFilter(_ROUTINE_FILTER)
