"""lwf-serve (deployments/launch.py): a SIGTERM or Ctrl-C stops `serve run` the way Ctrl-C does,
said once, without Ray's crash-like `*** SIGTERM received` trace (issue 57, item 6).

The unit tests run the launcher over a stand-in `serve run` that behaves as the real one does
on each signal (a KeyboardInterrupt: Serve's clean stop; SIGTERM: the Abseil trace); the last
one runs the real `serve run` of a one-deployment app and stops it with SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deployments.launch import STOPPING
from support import REPO

# What `serve run` does on each signal, in small: KeyboardInterrupt -> clean stop; SIGTERM -> the
# trace Ray's C++ handler prints, then exit 1.
STAND_IN = """
import signal, sys, time
def trace(signum, frame):
    print("*** SIGTERM received at time=1 on cpu 0 ***", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, trace)
try:
    print("ready", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("Got KeyboardInterrupt, shutting down...", flush=True)
    time.sleep(float(sys.argv[1]))
    print("stopped", flush=True)
"""


def _launch(tmp_path: Path, stop_s: float = 0.0, ignore_sigint: bool = False) -> subprocess.Popen:
    """The launcher over the stand-in (`serve_command` replaced), its output in one pipe."""
    (tmp_path / "serve_stand_in.py").write_text(STAND_IN)
    code = ("import sys, deployments.launch as l\n"
            f"l.serve_command = lambda argv: [sys.executable, {str(tmp_path / 'serve_stand_in.py')!r}, *argv]\n"
            f"sys.exit(l.main([{str(stop_s)!r}]))\n")
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=ignore, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().split() == ["ready", "True"]  # the child's SIGINT raises KeyboardInterrupt
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_is_said_once_and_becomes_the_clean_stop(tmp_path, signum):
    proc = _launch(tmp_path)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert out.splitlines() == [STOPPING, "Got KeyboardInterrupt, shutting down...", "stopped"]


def test_a_launcher_started_with_sigint_ignored_still_stops_its_server(tmp_path):
    """A background job of a non-interactive shell has SIGINT ignored, and its children with it:
    the child's is reset, or the clean stop would never come."""
    proc = _launch(tmp_path, ignore_sigint=True)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.splitlines()[-1] == "stopped", out


def test_a_second_signal_while_stopping_insists_with_sigterm(tmp_path):
    proc = _launch(tmp_path, stop_s=30.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline().strip() == STOPPING
    assert proc.stdout.readline().strip() == "Got KeyboardInterrupt, shutting down..."
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "*** SIGTERM received" in out, out  # asked twice: Ray's own stop


TOY_APP = """
from ray import serve

@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Hi:
    def __call__(self, request):
        return "hi"

app = Hi.bind()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
def test_sigterm_stops_serve_run_without_the_signal_trace(tmp_path):
    """The real `serve run` (its own local Ray) of a one-deployment app, stopped with SIGTERM
    through lwf-serve: the stop is said once, Serve's clean shutdown runs, no `SIGTERM received`
    trace, exit status 0, and the port is free again."""
    port = _free_port()
    (tmp_path / "toyapp.py").write_text(TOY_APP)
    (tmp_path / "toy.yaml").write_text(f"proxy_location: HeadOnly\nhttp_options:\n  host: 127.0.0.1\n  port: {port}\n"
                                       "applications:\n  - name: toy\n    route_prefix: /\n    import_path: toyapp:app\n")
    proc = subprocess.Popen([sys.executable, "-m", "deployments.launch", "toy.yaml"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text == "hi":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "serve run did not come up"
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert out.count(STOPPING) == 1 and "Got KeyboardInterrupt, shutting down..." in out, out[-3000:]
    assert "SIGTERM received" not in out and "clock_nanosleep" not in out, out[-3000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)


class _Child:
    """What Stopper.act needs of a Popen: poll() and send_signal(), recorded."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def poll(self):
        return None

    def send_signal(self, signum: int) -> None:
        self.sent.append(signum)


def test_two_signals_before_the_launcher_acts_send_sigint_then_sigterm():
    """The second signal's handler may run inside the first's (CI saw it: two SIGINTs, no
    SIGTERM): handlers only record, the main thread sends, once per signal, in order."""
    import io

    from deployments.launch import Stopper

    out = io.StringIO()
    stopper, child = Stopper(out=out), _Child()
    stopper(signal.SIGTERM, None)
    stopper(signal.SIGTERM, None)
    stopper.act(child)
    stopper.act(child)
    stopper(signal.SIGHUP, None)  # a third asks for nothing more
    stopper.act(child)
    assert child.sent == [signal.SIGINT, signal.SIGTERM]
    assert out.getvalue().splitlines() == [STOPPING]
