"""`lwf-serve CONFIG [serve run's options]`: `serve run CONFIG` with a quiet, clean stop.

Ctrl-C in `serve run`'s terminal is Serve's clean stop: a KeyboardInterrupt that shuts the app
and its local Ray instance down. `kill -TERM` of `serve run` does the same work, but first Ray's
C++ failure-signal handler (Abseil's, installed in the driver's core worker) prints a stack
trace of the signal, `*** SIGTERM received at time=... PC: @ ... clock_nanosleep` and a second
copy through Ray's logger, which reads like a crash. Ray has no switch for SIGTERM alone: its
`RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1` also silences the traces of real crashes (SIGSEGV,
SIGABRT) in every process the driver starts (replicas included), so it is not set here.

So this launcher runs `serve run` as its child in a process group of its own and turns a stop
into Serve's own clean one: on SIGTERM, SIGINT (Ctrl-C reaches only the launcher's group) or
SIGHUP (the terminal closed; the child's group would not get it) it says once that the server
is stopping, sends the child one SIGINT, and waits for it; a second signal while it waits sends
SIGTERM (Ray's handler, trace and all: the user asked twice). The child's SIGINT is reset to the
default first, so that a launcher started in the background of a non-interactive shell (SIGINT
ignored) still stops its child. Its exit status is the child's, 0 for a clean stop. Everything
else the child prints goes to the terminal unchanged (Ray's own shutdown lines included). A
SIGKILL of the launcher cannot be passed on: `serve run` then keeps running in its group.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Optional

STOPPING = "lwf-serve: stopping the server (Serve shuts the app and its local Ray down; a few seconds)"


def serve_command(argv: list[str]) -> list[str]:
    """`serve run ARGS` with the `serve` of this Python's environment (the venv's)."""
    serve = Path(sys.executable).with_name("serve")
    return [str(serve) if serve.exists() else "serve", "run", *argv]


def _child_setup() -> None:  # in the child, before exec
    os.setpgid(0, 0)  # its own group: a terminal's Ctrl-C reaches the launcher only
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then raises KeyboardInterrupt on it


class Stopper:
    """The launcher's SIGTERM / SIGINT / SIGHUP handler: the first asks the child for a clean
    stop (SIGINT, said once), a second one insists (SIGTERM).

    The handler only records the signal (one `list.append`, which a nested handler cannot
    undo); the main thread passes them on (`act`, between waits). Sending from the handler
    raced: a second signal whose handler ran inside the first one's, between its `send_signal`
    and its count, sent a second SIGINT instead of the SIGTERM (seen under CI load)."""

    def __init__(self, out=sys.stderr) -> None:
        self.out = out
        self.received: list[int] = []
        self.sent = 0

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            print(STOPPING, file=self.out, flush=True)

    def act(self, child: subprocess.Popen) -> None:
        """Send the child what the signals so far ask for and it has not had yet."""
        while self.sent < min(len(self.received), 2) and child.poll() is None:
            signum = signal.SIGINT if self.sent == 0 else signal.SIGTERM
            self.sent += 1
            child.send_signal(signum)


def wait(child: subprocess.Popen, stopper: Stopper, poll_s: float = 0.05) -> int:
    """The child's exit status, passing the stop signals on as they come."""
    while True:
        stopper.act(child)
        try:
            return child.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            continue


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: lwf-serve CONFIG.yaml [serve run's options]: `serve run` whose SIGTERM or Ctrl-C stops "
              "the server once and quietly (deployments/launch.py)")
        return 0 if args else 2
    stopper = Stopper()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(signum, stopper)
    child = subprocess.Popen(serve_command(args), preexec_fn=_child_setup)
    status = wait(child, stopper)
    return status if status >= 0 else 128 - status  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main())
