"""Structured logs: client-chosen values cannot forge lines or fields; typed errors log as INFO."""
from __future__ import annotations

import logging

from deployments.errors import Busy
from deployments.log import get_log, log_typed_errors_as_info


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
