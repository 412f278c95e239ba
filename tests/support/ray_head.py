"""A real Ray head started for a test (its own port and short temp dir), and the wait for a run's
first records, for the tests that kill a cluster or a replica under a running run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from serving.launcher import free_port


@contextlib.contextmanager
def ray_head(num_cpus: int, dashboard: bool = False) -> Iterator[subprocess.Popen]:
    """``ray start --head --block`` in its own session; yields the process (``.port`` set, and
    ``.dashboard`` -- the job submission URL, on loopback -- with ``dashboard``). Kill it with
    ``os.killpg(head.pid, SIGKILL)``: GCS, raylet and workers go with it."""
    ray_dir = tempfile.mkdtemp(prefix="rg", dir="/tmp")  # Ray's socket paths must stay short
    port, dashboard_port = free_port(), free_port()
    # with the dashboard, its job agent's own port too: the default (52365) may belong to
    # another Ray on this machine, and jobs then find "no available agent"
    flags = (["--include-dashboard=true", "--dashboard-host=127.0.0.1",
              f"--dashboard-port={dashboard_port}",
              f"--dashboard-agent-listen-port={free_port()}"] if dashboard
             else ["--include-dashboard=false"])  # fmt: skip
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         f"--port={port}", f"--num-cpus={num_cpus}", *flags,
         "--disable-usage-stats", f"--temp-dir={ray_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    head.port = port  # type: ignore[attr-defined]
    head.dashboard = f"http://127.0.0.1:{dashboard_port}"  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 120
        for listening in [port] + ([dashboard_port] if dashboard else []):
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", listening), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.5)
        yield head
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        shutil.rmtree(ray_dir, ignore_errors=True)


def wait_for_records(results: Path, count: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until ``results`` holds ``count`` records, ``proc`` ends, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_file() and results.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.02)
