"""A served app's seats, as the benchmarks that run against it count them (issue 54, item 8).

A seat is a DiT session slot (`sessions.capacity` of /v1/models: `sessions.max_sessions` times
the DiT replicas); a new session that finds every seat taken waits in the server's line
(benchmarks/line/wait.py records the wait). What needs more seats at once than the server has
(a second socket while a session is held, a fork) is skipped with `needs_seats`' reason,
recorded in the result, never an exception. A benchmark leaves no session parked behind it:
each resets what it opened, also when it fails or is cut short (`run_to_end`: SIGTERM,
gpu_serve.sh's `timeout`). gpu_serve.sh sizes its load runs to a config's seats:

    python -m benchmarks.line.seats serve_config.gpu.yaml --fit 1 1 2 3 4     # prints "1 1"
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Optional, TypeVar

from benchmarks.overlay import resolve
from benchmarks.serve_load import http_base, model_card

T = TypeVar("T")


def seats(url: str, api_key: Optional[str] = None) -> Optional[int]:
    """The seats of the app whose camera route is `url` (None when /v1/models is unreadable)."""
    try:
        return int(model_card(http_base(url), api_key)["sessions"]["capacity"])
    except Exception:  # noqa: BLE001 - unknown: the caller runs as on a server with seats to spare
        return None


def config_seats(path: Path) -> int:
    """The seats a serve config's (first) application starts with (an overlay resolved):
    `sessions.max_sessions` x the DiT's replicas (its `min_replicas` when it autoscales)."""
    from deployments.config import AppArgs

    args = AppArgs.model_validate(resolve(path)["applications"][0].get("args") or {})
    return args.sessions.max_sessions * (args.dit.autoscaling.min_replicas if args.dit.autoscaling
                                         else args.dit.num_replicas)


def needs_seats(needed: int, have: Optional[int]) -> Optional[str]:
    """Why a part that holds `needed` sessions at once is skipped on a server of `have` seats
    (None: it runs; an unknown count runs it)."""
    if have is None or have >= needed:
        return None
    return (f"needs {needed} sessions at once; the server has {have} seat{'s' if have != 1 else ''} "
            "(sessions.max_sessions x DiT replicas)")


def run_to_end(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, SIGTERM cancelling it: its `finally` and `except` blocks still run and
    reset the sessions it holds (a socket closed without a reset is parked for the server's
    `sessions.resume.grace_s`, its seat held from the next benchmark on a one-seat server)."""

    async def cancellable() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        main_thread = threading.current_thread() is threading.main_thread()  # (a test's thread: no signals)
        if main_thread:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await main
        finally:
            if main_thread:
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(cancellable())


def main(argv: Optional[list[str]] = None) -> str:
    p = argparse.ArgumentParser(description="A serve config's seats (sessions.max_sessions x DiT replicas)")
    p.add_argument("config", type=Path, help="a serve config or an overlay of one (benchmarks/overlay.py)")
    p.add_argument("--fit", type=int, nargs="+", default=None,
                   help="session counts: print those within the seats instead of the seats")
    args = p.parse_args(argv)
    have = config_seats(args.config)
    text = str(have) if args.fit is None else " ".join(str(n) for n in args.fit if n <= have)
    print(text)
    return text


if __name__ == "__main__":
    main()
