"""A real single-node Slurm for the recipe's test: Debian's slurmctld, slurmd and munge, a
minimal slurm.conf of our own in a temporary folder, started as root (``slurm_cluster``), and
the calls a test makes (submit, wait, cancel)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")


def unavailable() -> str | None:
    """Why a Slurm cannot be started here (None: it can, after ``install`` where it is
    missing). Cheap: collection calls it on every worker."""
    if os.geteuid() != 0:
        return "needs root: slurmd and munged run as root (CI runs as root)"
    if not installed() and not shutil.which("apt-get"):
        return "no slurm-wlm and no apt-get to install it"
    return None


def installed() -> bool:
    return all(shutil.which(c) for c in ("slurmctld", "slurmd", "munged", "sbatch"))


def install() -> str | None:
    """Debian's Slurm and munge installed with apt where missing (None), else why not."""
    if installed():
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:  # the package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return f"apt-get could not install {', '.join(PACKAGES)}: {done.stderr.strip()[-300:]}"
    return None


@dataclass
class Slurm:
    conf: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def submit(self, options: list[str], script: Path, args: list[str], env: dict[str, str]) -> str:
        """``sbatch OPTIONS SCRIPT ARGS``; the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *options, str(script), *args],
            capture_output=True,
            text=True,
            env=env | {"SLURM_CONF": self.env["SLURM_CONF"]},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...)."""
        done = self.run("scontrol", "show", "job", job, "-o")
        for field in done.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait(self, job: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} still {self.state(job)} after {timeout} s")

    def cancel(self, job: str) -> None:
        assert self.run("scancel", job).returncode == 0


@contextlib.contextmanager
def slurm_cluster(cpus: int, memory_mb: int = 4096) -> Iterator[Slurm]:
    """slurmctld and slurmd for this host in a temporary folder, stopped at the end."""
    root = Path(tempfile.mkdtemp(prefix="gc-slurm-"))
    host = socket.gethostname()
    for name in ("state", "spool", "log"):
        (root / name).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=groundcover",
                f"SlurmctldHost={host}",
                "AuthType=auth/munge",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "ReturnToService=2",
                "KillWait=30",  # Slurm's default: SIGKILL this long after the SIGTERM
                "SchedulerType=sched/builtin",
                f"NodeName={host} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
                "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                "OverSubscribe=YES",
                "",
            ]
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    started: list[subprocess.Popen] = []
    munge_pid = Path("/run/munge/munged.pid")
    ours = not Path("/run/munge/munge.socket.2").exists()  # a munged already up stays up
    try:
        if ours:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            subprocess.run(["munged", "--force"], check=True, timeout=60, env=env)
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            started.append(
                subprocess.Popen(
                    [*daemon, "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        cluster = Slurm(conf, env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shown = cluster.run("sinfo", "-h", "-o", "%t").stdout.split()
            if shown and shown[0] in ("idle", "mix", "alloc"):
                break
            time.sleep(0.5)
        else:
            log = (root / "log" / "slurmctld.log").read_text()[-2000:]
            raise AssertionError(f"Slurm did not come up: {shown}\n{log}")
        try:
            yield cluster
        finally:  # a failed test's jobs end with it, before the daemons do
            cluster.run("scancel", "--full", "--user", "root")
            deadline = time.monotonic() + 60
            while cluster.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
    finally:
        for process in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if ours and munge_pid.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(munge_pid.read_text().strip()), signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
