"""benchmarks/line/seats.py and wait.py without a server (issue 54, item 8): a config's seats, the
load runs gpu_serve.sh keeps for them, the reason a two-seat part is skipped, a session's wait."""
from __future__ import annotations

import time

from benchmarks.line.seats import config_seats, main, needs_seats
from benchmarks.line.wait import LineWait
from protocol.messages import Queued
from support import REPO


def test_the_shipped_configs_seats_and_the_load_runs_that_fit_them():
    assert config_seats(REPO / "serve_config.gpu.yaml") == 1  # the one-seat 80 GB config
    assert config_seats(REPO / "serve_config.h200.yaml") == 2
    assert config_seats(REPO / "benchmarks/serve_config.h100.gpu.yaml") == 1  # an overlay of it
    assert config_seats(REPO / "benchmarks/serve_config.h200.autoscale_fp8.yaml") == 1  # its min_replicas
    assert main([str(REPO / "serve_config.gpu.yaml"), "--fit", "1", "1", "2", "3", "4"]) == "1 1"
    assert main([str(REPO / "benchmarks/serve_config.h200.yaml"), "--fit", "1", "1", "2", "3", "4"]) == "1 1 2 3 4"


def test_a_part_is_skipped_only_where_the_seats_are_known_to_be_too_few():
    assert needs_seats(2, 1) == ("needs 2 sessions at once; the server has 1 seat "
                                 "(sessions.max_sessions x DiT replicas)")
    assert needs_seats(2, 2) is None and needs_seats(2, None) is None


def test_a_wait_runs_from_the_first_notice_to_the_first_frame():
    never = LineWait()
    never.served()
    assert never.report() == {"queued_s": 0.0, "notices": 0, "first_position": None, "first_eta_s": None}
    wait = LineWait()
    wait.notice(Queued(session_id="s", position=2, eta_s=4.0, queue_token="t"))
    time.sleep(0.05)
    wait.notice(Queued(session_id="s", position=1, eta_s=1.0, queue_token="t"))
    wait.served()
    served_at = wait.served_at
    wait.served()  # a later frame ends nothing more
    report = wait.report()
    assert wait.served_at == served_at and report["notices"] == 2 and wait.positions == [2, 1]
    assert report["first_position"] == 2 and report["first_eta_s"] == 4.0 and 0.05 <= report["queued_s"] < 5
