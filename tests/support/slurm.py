"""A real Slurm for the recipe's test: Debian's slurmctld, slurmd and munge, a minimal
slurm.conf of our own in a temporary folder, started as root (``slurm_cluster``), and the calls
a test makes (submit, wait, cancel).

With ``nodes=2`` the two nodes are two network namespaces made here (``Network``), joined by a
veth pair with an address on each end and none elsewhere, so nothing outside is contacted.
Each node's slurmd runs in its namespace with a host name of its own (a UTS namespace) and its
own ``/etc/hosts`` (bind-mounted in a mount namespace), so on node ``n2`` ``hostname`` says n2
and ``hostname --ip-address`` gives n2's veth address, as on a real cluster; slurmctld runs on
n1. Every job's process is then in one node's network namespace, which tells the nodes apart
on this one machine."""

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
from typing import Any

# a job in these states has not ended (REQUEUED: on its way back to PENDING)
UNFINISHED = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED")
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
    network: Network | None = None  # two nodes: Slurm's commands run where slurmctld is

    def run(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.on_head(), *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def on_head(self) -> list[str]:
        return self.network.enter(0) if self.network else []

    def submit(self, options: list[str], script: Path, args: list[str], env: dict[str, str]) -> str:
        """``sbatch OPTIONS SCRIPT ARGS``; the job id. Submitted from the cluster's own folder:
        what a job writes beside its submit directory never lands in the checkout."""
        done = subprocess.run(
            [*self.on_head(), "sbatch", "--parsable", *options, str(script), *args],
            cwd=self.conf.parent,
            capture_output=True,
            text=True,
            env=env | {"SLURM_CONF": self.env["SLURM_CONF"]},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...); GONE once Slurm
        no longer knows it. A busy slurmctld that times out is asked again, never read as GONE."""
        deadline = time.monotonic() + 300
        while True:
            done = self.run("scontrol", "show", "job", job, "-o")
            if done.returncode == 0 or "Invalid job id" in done.stderr:
                break
            assert time.monotonic() < deadline, f"scontrol show job {job}: {done.stderr.strip()}"
            time.sleep(1)
        for field in done.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait(self, job: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state not in UNFINISHED:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} still {self.state(job)} after {timeout} s")

    def cancel(self, job: str, *options: str) -> None:
        assert self.run("scancel", *options, job).returncode == 0

    def stepds(self, job: str) -> list[int]:
        """The job's slurmstepd processes still running (on any node of this machine)."""
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(f"slurmstepd: [{job}.".encode()):
                found.append(int(entry))
        return found

    def field(self, job: str, name: str) -> str:
        """One field of ``scontrol show job`` (Restarts, NodeList, ...)."""
        done = self.run("scontrol", "show", "job", job, "-o")
        for part in done.stdout.split():
            if part.startswith(name + "="):
                return part.split("=", 1)[1]
        return ""


class Network:
    """Network namespaces made for a test, one per node, joined by veth pairs to the first;
    addresses only on those veths. Named after this process, removed at the end."""

    def __init__(self, nodes: int) -> None:
        tag = os.getpid() % 100000
        self.names = [f"gc{tag}n{k + 1}" for k in range(nodes)]
        self.hosts = [f"n{k + 1}" for k in range(nodes)]
        self.subnet = f"10.213.{tag % 250}"
        self.addresses = [f"{self.subnet}.{k + 1}" for k in range(nodes)]
        self.made: list[str] = []

    def up(self) -> None:
        """The namespaces and their veth pair; whatever was made is removed if a step fails."""
        if len(self.names) != 2:
            raise ValueError("two nodes: one veth pair")
        try:
            self._make()
        except BaseException:
            self.down()
            raise

    def _make(self) -> None:
        for name in self.names:
            ip("netns", "add", name)
            self.made.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        a, b = (f"{n}v" for n in self.names)
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        for name, end, address in zip(self.names, (a, b), self.addresses, strict=True):
            ip("link", "set", end, "netns", name)
            ip("-n", name, "addr", "add", f"{address}/24", "dev", end)
            ip("-n", name, "link", "set", end, "up")
            hosts = Path("/etc/netns") / name / "hosts"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            lines = [f"{ad} {h}" for ad, h in zip(self.addresses, self.hosts, strict=True)]
            hosts.write_text("\n".join(["127.0.0.1 localhost", *lines, ""]))

    def down(self) -> None:
        for end in (f"{n}v" for n in self.names):  # a veth end not yet moved into its namespace
            subprocess.run(["ip", "link", "delete", end], capture_output=True, timeout=60)
        for name in self.made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=60)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only if it is empty (made here)

    def enter(self, node: int) -> list[str]:
        """A command's prefix that runs it in node ``node``'s network (only)."""
        return ["nsenter", f"--net=/run/netns/{self.names[node]}"]

    def as_node(self, node: int) -> list[str]:
        """A daemon's prefix: the node's network, host name and /etc/hosts."""
        name, host = self.names[node], self.hosts[node]
        script = f"mount --bind /etc/netns/{name}/hosts /etc/hosts && hostname {host} && "
        return [
            *self.enter(node),
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            script + 'exec "$@"',
            "sh",
        ]

    def namespace_of(self, pid: int) -> int | None:
        """Which node a process runs on (its network namespace), None if neither."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for k, name in enumerate(self.made):
            if os.stat(f"/run/netns/{name}").st_ino == inode:
                return k
        return None

    def listen(self, node: int, port: int = 0) -> socket.socket:
        """A TCP socket bound to ``port`` (0: a free one) of node ``node``'s address, made from
        a thread that enters the namespace (setns applies to the calling thread only)."""
        import ctypes
        import threading

        made: dict[str, Any] = {}

        def bind() -> None:
            fd = os.open(f"/run/netns/{self.names[node]}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    made["error"] = OSError(ctypes.get_errno(), "setns")
                    return
                sock = socket.socket()
                sock.bind((self.addresses[node], port))
                made["socket"] = sock
            finally:
                os.close(fd)

        thread = threading.Thread(target=bind)
        thread.start()
        thread.join()
        if "error" in made:
            raise made["error"]
        return made["socket"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """A SIGTERM to this process (an outer timeout ending the test run) raises SystemExit in
    the main thread, so the ``finally`` blocks inside run: the namespaces, daemons and jobs a
    module made are taken down as after a failed test. (SIGKILL cannot be caught.)"""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the cleanup runs to its end
        raise SystemExit(f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def slurm_cluster(cpus: int, memory_mb: int = 4096, nodes: int = 1) -> Iterator[Slurm]:
    """slurmctld and slurmd for this host (or for ``nodes`` namespaces of it) in a temporary
    folder, stopped at the end (also when the test run is ended by SIGTERM)."""
    with sigterm_as_exit():
        yield from _slurm_cluster(cpus, memory_mb, nodes)


def _slurm_cluster(cpus: int, memory_mb: int, nodes: int) -> Iterator[Slurm]:
    root = Path(tempfile.mkdtemp(prefix="gc-slurm-"))
    network = Network(nodes) if nodes > 1 else None
    host = socket.gethostname()
    for name in ("state", "spool", "log"):
        (root / name).mkdir()
    conf = root / "slurm.conf"
    if network is not None:
        network.up()
        control = f"{network.hosts[0]}({network.addresses[0]})"
        node_lines = [
            f"NodeName={h} NodeAddr={a} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
            for h, a in zip(network.hosts, network.addresses, strict=True)
        ]
    else:
        control = host
        node_lines = [f"NodeName={host} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"]
    conf.write_text(
        "\n".join(
            [
                "ClusterName=groundcover",
                f"SlurmctldHost={control}",
                "AuthType=auth/munge",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}/%n",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
                "ProctrackType=proctrack/linuxproc",  # no cgroup hierarchy to use here
                # two nodes: CPU binding, as on a cluster (affinity runs here; cgroup does not)
                f"TaskPlugin={'task/affinity' if network else 'task/none'}",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "ReturnToService=2",
                "KillWait=30",  # Slurm's default: SIGKILL this long after the SIGTERM
                # a loaded test machine answers slowly: Slurm's 10 s default dropped slurmd's
                # registrations in a CI run ("Socket timed out on send/recv operation")
                "MessageTimeout=60",
                "SchedulerType=sched/builtin",
                *node_lines,
                "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                "OverSubscribe=YES",
                "",
            ]
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    started: list[subprocess.Popen] = []
    munge_pid = Path("/run/munge/munged.pid")
    # a munged that answers stays up; a socket left by one that is gone is started over
    ours = subprocess.run(["munge", "-n"], capture_output=True, timeout=60).returncode != 0
    try:
        if ours:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            subprocess.run(["munged", "--force"], check=True, timeout=60, env=env)
        daemons = [["slurmctld", "-D", "-i"], ["slurmd", "-D"]]
        if network is not None:  # slurmctld on n1, a slurmd on each node
            daemons = [network.as_node(0) + daemons[0]] + [
                network.as_node(k) + daemons[1] for k in range(nodes)
            ]
        for daemon in daemons:
            started.append(
                subprocess.Popen(
                    [*daemon, "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        cluster = Slurm(conf, env, network)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            asked = cluster.run("sinfo", "-h", "-N", "-o", "%t")
            shown = asked.stdout.split()
            if len(shown) == nodes and all(s in ("idle", "mix", "alloc") for s in shown):
                break
            time.sleep(0.5)
        else:
            log = (root / "log" / "slurmctld.log").read_text()[-2000:]
            raise AssertionError(f"Slurm did not come up: {shown} {asked.stderr.strip()}\n{log}")
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
        if network is not None:
            network.down()
        if not os.environ.get("GC_SLURM_KEEP"):  # set: the daemons' logs stay, to read
            shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
