"""Structured logs: client-chosen values cannot forge lines or fields; typed errors log as INFO;
the health traffic's access-log lines are DEBUG."""
from __future__ import annotations

import logging

from deployments.errors import Busy
from deployments.log import get_log, log_routine_access_at_debug, log_typed_errors_as_info


def _lines(caplog) -> list[str]:
    return [line for r in caplog.records for line in r.getMessage().splitlines()]


def test_control_characters_in_field_values_are_escaped(caplog):
    log = get_log("test_log")
    evil = 's1\nINFO forged line session=admin\r\x1b[2J\u2028x'
    with caplog.at_level(logging.INFO, logger="ray.serve.lwf.test_log"):
        log.info("session started", fields={"session": evil, "plain": "abc-1~2"})
    lines = _lines(caplog)
    assert len(lines) == 1, lines  # no second line was forged
    line = lines[0]
    assert "\x1b" not in line and "\r" not in line and "\u2028" not in line
    assert 'session="s1\\nINFO forged line session=admin\\r\\u001b[2J\\u2028x"' in line
    assert line.endswith("plain=abc-1~2")  # ordinary values stay bare


def test_a_typed_replica_error_is_one_info_line_without_traceback(caplog):
    log_typed_errors_as_info()
    serve_log = logging.getLogger("ray.serve")
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        try:
            raise Busy("all 2 session slots of this replica are taken", 5.0)
        except Busy:
            serve_log.exception("Request failed.")
        try:
            raise KeyError("a real fault")
        except KeyError:
            serve_log.exception("Request failed.")
    busy, fault = [r for r in caplog.records if r.name == "ray.serve"]
    assert busy.levelno == logging.INFO and busy.exc_info is None
    assert busy.getMessage() == "request answered with busy: all 2 session slots of this replica are taken"
    assert fault.levelno == logging.ERROR and fault.exc_info is not None  # real faults keep their traceback


PROBE_LINES = ("GET /healthz 200 12.3ms", "127.0.0.1:53122 GET /healthz 503 10001.2ms", "CALL probe OK 0.4ms",
               "CALL stats OK 1.1ms", "CALL step OK 1830.2ms", "CALL decode OK 97.0ms",
               "GET / 200 3.1ms", "127.0.0.1:53124 GET /{path:path} 200 2.4ms", "GET /{path:path} 304 1.0ms",
               "GET /static 200 1.2ms")  # routine: DEBUG (the last four: a page load's files)
OTHER_LINES = ("GET /v1/models 200 5.0ms", "CALL step ERROR 12.0ms", "GET /healthz-report 200 1.0ms",
               "WS /v1/realtime/world/camera 101 60012.0ms", "GET /{path:path} 404 1.1ms", "POST /v1/videos 200 9.0ms",
               "WS /{path:path} 403 2.0ms")


def _access_lines(level: int, caplog) -> list[tuple[int, str]]:
    """Serve's access-log records (as its replicas and proxy log them) at `level`, what is kept."""
    log_routine_access_at_debug()
    serve_log = logging.getLogger("ray.serve")
    with caplog.at_level(level, logger="ray.serve"):
        for line in PROBE_LINES + OTHER_LINES:
            serve_log.info(line, extra={"serve_access_log": True})
        serve_log.info("CALL probe OK 0.4ms")  # not an access-log record: untouched
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ray.serve"]


def test_health_and_call_access_lines_are_dropped_at_info(caplog):
    kept = _access_lines(logging.INFO, caplog)
    assert kept == [(logging.INFO, line) for line in OTHER_LINES + ("CALL probe OK 0.4ms",)]


def test_health_and_call_access_lines_show_at_debug(caplog):
    kept = _access_lines(logging.DEBUG, caplog)
    assert kept[:len(PROBE_LINES)] == [(logging.DEBUG, line) for line in PROBE_LINES]
    assert kept[len(PROBE_LINES):] == [(logging.INFO, line) for line in OTHER_LINES + ("CALL probe OK 0.4ms",)]
