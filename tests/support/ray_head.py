"""A real Ray head started for a test (its own port and short temp dir), and the wait for a run's
first records, for the tests that kill a cluster or a replica under a running run."""

from __future__ import annotations

import contextlib
import json
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

from groundcover.serving.cluster.job import ensure_ray_token
from groundcover.serving.launch import startlog
from groundcover.serving.launch.server import free_port


@contextlib.contextmanager
def ray_head(
    num_cpus: int, dashboard: bool = False, resources: dict[str, float] | None = None
) -> Iterator[subprocess.Popen]:
    """``ray start --head --block`` in its own session; yields the process (``.port`` set, and
    ``.dashboard`` -- the job submission URL, on loopback -- with ``dashboard``). Kill it with
    ``os.killpg(head.pid, SIGKILL)``: GCS, raylet and workers go with it."""
    ray_dir = tempfile.mkdtemp(prefix="rg", dir="/tmp")  # Ray's socket paths must stay short
    port, dashboard_port = free_port(), free_port()
    # with the dashboard, its job agent's own port too: the default (52365) may belong to
    # another Ray on this machine, and jobs then find "no available agent"
    flags = (
        [
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--dashboard-agent-listen-port={free_port()}",
        ]
        if dashboard
        else ["--include-dashboard=false"]
    )
    ray = str(Path(sys.executable).with_name("ray"))
    # token mode, as the cluster job runs Ray: `ray start --head` in it needs a token, made
    # by the job's rule where Ray would find none (a fresh machine has none)
    ensure_ray_token()
    head = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            *flags,
            *_resources(resources),
            "--disable-usage-stats",
            f"--temp-dir={ray_dir}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, RAY_AUTH_MODE="token"),
    )
    head.port = port  # type: ignore[attr-defined]
    head.dashboard = f"http://127.0.0.1:{dashboard_port}"  # type: ignore[attr-defined]
    try:
        began = deadline = time.monotonic()
        deadline += 120
        for listening in [port] + ([dashboard_port] if dashboard else []):
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", listening), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.5)
        startlog.record("ray-head", f"{num_cpus} CPUs", time.monotonic() - began)
        yield head
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _resources(resources: dict[str, float] | None) -> list[str]:
    return [f"--resources={json.dumps(resources)}"] if resources else []


@contextlib.contextmanager
def ray_worker(
    head: subprocess.Popen, num_cpus: int, resources: dict[str, float]
) -> Iterator[subprocess.Popen]:
    """A second node joined to ``head`` (``ray start --address --block``, its own raylet and
    object store on this machine), told apart by a custom resource. Killing its process group
    is a lost node: its raylet and every worker on it go, the head stays."""
    ray = str(Path(sys.executable).with_name("ray"))
    address = f"127.0.0.1:{head.port}"  # type: ignore[attr-defined]
    before = _node_count(address, ray)
    worker = subprocess.Popen(
        [
            ray,
            "start",
            f"--address={address}",
            "--block",
            f"--num-cpus={num_cpus}",
            *_resources(resources),
            "--disable-usage-stats",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, RAY_AUTH_MODE="token"),  # joins with the head's token
    )
    try:
        began = time.monotonic()
        deadline = began + 120
        while _node_count(address, ray) <= before and time.monotonic() < deadline:
            time.sleep(1.0)
        startlog.record("ray-worker", f"{num_cpus} CPUs", time.monotonic() - began)
        yield worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)


def _node_count(address: str, ray: str) -> int:
    """Alive nodes of the cluster, asked from a separate driver."""
    probe = (
        f"import ray; from groundcover.serving.cluster.join import connect; connect({address!r}); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.split()
    return int(lines[-1]) if done.returncode == 0 and lines else 0


def wait_for_records(results: Path, count: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until ``results`` holds ``count`` records, ``proc`` ends, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_file() and results.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.02)
