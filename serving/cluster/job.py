"""One groundcover command on a Slurm allocation (``groundcover cluster run``, which
``scripts/slurm/groundcover.sbatch`` calls on the allocation's first node): a Ray cluster over
its nodes, the judge and the NLI app served on it as planned (``plan``), the command spread
over the nodes, and everything stopped however the job ends.

In order: the judge identified by its weights' content or revision (never the head's URL,
which a requeue moves); the head's address; the port block (from the job id) checked on every
node, a clash moving the job once; **the command's own dry run with every flag it will get**,
so that a command that cannot run stops the job before anything loads; Ray over the
allocation, one ``srun`` step per node (``python -m groundcover.serving.cluster.job node``)
running ``ray start --block`` with the node's address, CPUs and GPUs, its files in
``/tmp/gc-ray-JOB-NODE``; Serve with its HTTP proxy on the judge's port; the NLI app; the judge
(``groundcover serve MODEL --replicas R --tensor-parallel-size T``, waited for until every
replica is healthy); the command. Then the end -- the command done, ``scancel``, the time
limit's warning (SIGUSR1, acted on during any wait too) or Ctrl-C: the command asked to stop
(the run stays resumable), the judge and every node's step ended within ``SHUTDOWN`` seconds
(Slurm's KillWait is 30 by default), each node's logs copied into the run directory; after the
warning the job is requeued, at most ``max_requeues`` times.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import make_dirs, write_atomic
from .plan import (
    PORT_BLOCK,
    PORT_CEILING,
    PORT_FLOOR,
    Allocation,
    Plan,
    block_ports,
    gpu_mib_here,
    mib_readings,
    other_block,
)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# The whole shutdown fits Slurm's default KillWait (30 s, after which it kills every step):
# the command GRACE seconds, then the judge's server and every node's step together, each node
# STEP_GRACE for its Ray and a few seconds for the logs (STEPS_WAIT in all).
GRACE = 12.0
STEP_GRACE = 5.0
STEPS_WAIT = 12.0
SHUTDOWN = GRACE + STEPS_WAIT  # 24 s
# the judge's proxy asks for a key made for the job (serve_app's names)
KEY_ENV = "GROUNDCOVER_SERVE_API_KEY"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "groundcover.serving.cluster.serve_app:proxy_middlewares"
# Settings docs/clusters.md says every node's Ray needs, set for every step the job starts: a
# loaded node starts Serve's proxy in more than Ray's default 5 s
CLUSTER_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
NLI_RESOURCE = "groundcover_nli"  # offered by the nodes planned to hold an NLI replica, one each
# one per driver the plan puts on a node, offered by that node: the command's drivers ask for
# one each and no CPU (they wait on the judge; a CPU each could be held by Serve's replicas, as
# on nodes of few CPUs, and a driver left unplaced waits forever)
DRIVER_RESOURCE = "groundcover_driver"
DRIVER_PLACE = {"CPU": 0, DRIVER_RESOURCE: 1}
LOG_FILE_CAP = 4 * 2**20  # the last 4 MiB of each log file
LOG_NODE_CAP = 64 * 2**20  # at most 64 MiB of logs per node
DEFAULT_TOKEN = Path.home() / ".ray" / "auth_token"


class ClusterError(RuntimeError):
    """The job cannot go on: one line saying why (the job's log holds what came before)."""


class Interrupted(Exception):
    """A stop signal came while the launcher waited for something to start."""

    def __init__(self, signum: int, during: str):
        super().__init__(during)
        self.signum, self.during = signum, during


@dataclass
class Job:
    """What ``cluster run`` hands over: the plan, the command (checked by the CLI: ``accepts``
    holds the launcher's flags it takes), and the commands the job starts."""

    plan: Plan
    allocation: Allocation
    command: list[str]
    accepts: frozenset[str]
    ray: str
    groundcover: str
    serve: str
    judge_revision: str | None = None
    port_base: int | None = None
    pin_nli: bool = True  # by the resource the planned nodes offer (Slurm); on KubeRay, by Ray
    own_placement: bool = False  # the command places its drivers (its flag or its config)


def say(text: str) -> None:
    print(f"cluster: {text}", file=sys.stderr, flush=True)


def node_name() -> str:
    """This node by Slurm's name (``SLURMD_NODENAME``, which every step has), not by
    ``gethostname()``, which may differ (an FQDN, another interface's name)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


# ---- ports and addresses -----------------------------------------------------------------------


def port_taken(port: int) -> bool:
    """Whether something on this node holds ``port`` (a bind on every address fails)."""
    for family, anywhere in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((anywhere, port))
            except OSError as exc:
                if family == socket.AF_INET6 and exc.errno == 97:  # no IPv6 on this node
                    continue
                return True
    return False


def taken_here(first: int, last: int) -> list[int]:
    return [port for port in range(first, last + 1) if port_taken(port)]


def ports_main(argv: list[str]) -> int:
    """``job ports FIRST LAST``, one srun task per node: the ports of the range in use there,
    a line ``NODE PORT`` each; and the node's GPUs' memory, ``NODE gpu-mib 81559,40960``
    (``none`` on a node without, or where ``nvidia-smi`` cannot read them)."""
    first, last = int(argv[0]), int(argv[1])
    for port in taken_here(first, last):
        print(f"{node_name()} {port}", flush=True)
    sizes = gpu_mib_here()
    print(f"{node_name()} gpu-mib {','.join(f'{v:.0f}' for v in sizes) or 'none'}", flush=True)
    return 0


@dataclass
class NodeReports:
    """What the nodes' ``job ports`` tasks said: the ports in use, each node's GPUs' MiB."""

    taken: list[tuple[str, int]]
    gpu_mib: dict[str, list[float]]


def read_reports(lines: list[str]) -> NodeReports:
    taken: list[tuple[str, int]] = []
    gpu_mib: dict[str, list[float]] = {}
    for words in (line.split() for line in lines):
        if len(words) == 2 and words[1].isdigit():
            taken.append((words[0], int(words[1])))
        elif len(words) == 3 and words[1] == "gpu-mib":
            gpu_mib[words[0]] = mib_readings(words[2].split(","))
    return NodeReports(taken, gpu_mib)


def ports_steps(alloc: Allocation, first: int, last: int) -> list[list[str]]:
    """The ``job ports`` steps: one per component of the job (a heterogeneous job's each named
    by ``--het-group``), one task on each of its nodes, with its GPUs (what ``nvidia-smi`` then
    sees is what the node's Ray will have)."""
    return [
        [
            *srun_step(nodes, 1, part.gpus, part.index),
            *this_module(),
            "ports",
            str(first),
            str(last),
        ]
        for part, nodes in alloc.groups(alloc.nodes)
    ]


def node_reports(alloc: Allocation, first: int, last: int) -> NodeReports | None:
    """Every node's report (``job ports``), or None where a step failed (no srun: run by
    hand, not in a job)."""
    lines: list[str] = []
    for ask in ports_steps(alloc, first, last):
        try:
            done = subprocess.run(ask, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        lines += done.stdout.split("\n")
    return read_reports(lines)


def host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def interface_address(name: str) -> str:
    """The address of the interface ``name`` (``ib0``): its IPv4 address, else its global IPv6
    one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", name.encode()[:15])
        with contextlib.suppress(OSError):
            answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            return socket.inet_ntoa(answer[20:24])
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw, _, _, scope, _, device = line.split()
            if device == name and scope == "00":  # global scope
                return str(ipaddress.IPv6Address(bytes.fromhex(raw)))
    raise ClusterError(f"GC_HEAD_INTERFACE={name}: no address on {name} on this node")


def interface_addresses() -> list[str]:
    """Every IPv4 address of this node's interfaces, loopback left out."""
    found = []
    for _, name in socket.if_nameindex():
        with contextlib.suppress(ClusterError):
            address = interface_address(name)
            if not _loopback(address) and ":" not in address:
                found.append(address)
    return found


def ordered_addresses(addresses: list[str]) -> list[str]:
    """Outward addresses first, IPv4 before IPv6, each once; a link-local IPv6 address (it
    needs its interface named) left out."""
    unique = list(dict.fromkeys(a.split("%")[0] for a in addresses))
    unique = [a for a in unique if not a.lower().startswith("fe80:")]
    outward = [a for a in unique if not _loopback(a)]
    return sorted(outward, key=lambda a: ":" in a) + [a for a in unique if _loopback(a)]


def head_address(env: dict[str, str], several_nodes: bool) -> str:
    """The head's address, found on the head (the batch step runs there): ``GC_HEAD_ADDRESS``,
    else ``GC_HEAD_INTERFACE``'s address, else what the node's name resolves to (IPv4 first),
    else -- a name that resolves only to loopback, as a ``127.0.1.1`` hosts entry makes it --
    the node's one non-loopback IPv4 address. A one-node job may stay on loopback."""
    if env.get("GC_HEAD_ADDRESS"):
        return env["GC_HEAD_ADDRESS"].strip("[]")
    if env.get("GC_HEAD_INTERFACE"):
        return interface_address(env["GC_HEAD_INTERFACE"])
    found: list[str] = []
    with contextlib.suppress(OSError):
        found = [str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)]
    ordered = ordered_addresses(found)
    if ordered and not _loopback(ordered[0]):
        return ordered[0]
    if not several_nodes:
        return ordered[0] if ordered else "127.0.0.1"
    own = interface_addresses()
    if len(own) == 1:
        return own[0]
    names = " ".join(found) or "nothing"
    pick = f" and has {len(own)} addresses ({' '.join(own)})" if own else ""
    raise ClusterError(
        f"{socket.gethostname()} resolves only to {names}{pick}: export "
        "GC_HEAD_INTERFACE=<the interface the nodes share, e.g. ib0> before sbatch"
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def route_source(host: str, port: int) -> str:
    """This node's address on the way to ``host``: the one the kernel would send from (a UDP
    socket's connect sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


# ---- waiting, with the time limit in mind ------------------------------------------------------


class Stopping:
    """The first stop signal asks the command to stop; the launcher then cleans up."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.signal is None:
            self.signal = signum
            say(f"{signal.Signals(signum).name}: stopping the command (the run stays resumable)")
            if self.child is not None and self.child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.child.pid, signal.SIGTERM)
        elif self.child is not None and self.child.poll() is None:  # asked again: end it now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signal.SIGKILL)


def waited(command: list[str], what: str, timeout: float, stopping: Stopping) -> int:
    """Run ``command`` and wait for it, giving way at once to a stop signal (the time limit's
    warning during a long deploy): the child is ended and ``Interrupted`` raised."""
    child = subprocess.Popen(command, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return child.wait(1)
        except subprocess.TimeoutExpired:
            pass
        if stopping.signal is not None or time.monotonic() > deadline:
            end_group(child)
            if stopping.signal is not None:
                raise Interrupted(stopping.signal, what)
            raise ClusterError(f"{what} took more than {timeout:.0f} s")


def end_group(child: subprocess.Popen[bytes], grace: float = STEP_GRACE) -> None:
    if child.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)


def _waits_for(child: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        child.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


# ---- Ray over the allocation -------------------------------------------------------------------


def srun_step(
    nodes: list[str], cpus: int, gpus: str | None = None, het_group: int | None = None
) -> list[str]:
    """One task on each of ``nodes``, sharing the allocation with the other steps, with the
    CPUs (and GPUs) it may use there: since Slurm 22.05 a step no longer inherits the job's
    ``--cpus-per-task``, and with CPU binding it would get one core. In a heterogeneous job
    ``nodes`` are one component's, which the step names (``--het-group``: without it a step
    runs in component 0 only)."""
    return [
        "srun",
        *([f"--het-group={het_group}"] if het_group is not None else []),
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        *([f"--gpus-per-node={gpus}"] if gpus else []),
        f"--nodelist={','.join(nodes)}",
        "--overlap",
        "--kill-on-bad-exit=0",
    ]


def this_module() -> list[str]:
    """How a step runs this module on a node: the checkout's Python, by module name."""
    return [sys.executable, "-m", "groundcover.serving.cluster.job"]


class Cluster:
    """Ray over the allocation: one ``srun`` step per node (``job node``), each running
    ``ray start --block`` with the node's own address and resources."""

    def __init__(
        self,
        alloc: Allocation,
        plan: Plan,
        ray: str,
        stopping: Stopping,
        head: str | None = None,
        logs: Path | None = None,
    ) -> None:
        self.alloc, self.plan, self.stopping = alloc, plan, stopping
        self.ray = ray
        self.temp = f"/tmp/gc-ray-{alloc.job}"  # + the node's name; socket paths must stay short
        self.head = head or alloc.head
        self.logs = logs
        self.steps: list[subprocess.Popen[bytes]] = []
        self.servers: list[subprocess.Popen[bytes]] = []  # the judge's ``groundcover serve``

    @property
    def ports(self) -> dict[str, int]:
        return self.plan.ports

    @property
    def address(self) -> str:
        return host_port(self.head, self.ports["port"])

    def choose_ports(self, fixed: bool) -> None:
        """The plan's block, checked on every node; a clash moves the job once, to the block
        half the ring away (never with ``GC_RAY_PORT_BASE``, which fixes the block)."""
        taken = self.taken(self.ports["port"], self.ports["max-worker-port"])
        if not taken:
            return
        held = ", ".join(f"{port} on {node}" for node, port in taken[:5])
        if fixed:
            raise ClusterError(f"GC_RAY_PORT_BASE's block has ports in use: {held}")
        moved = block_ports(other_block(self.ports["port"]))
        say(
            f"ports in use: {held}; moving the job to ports {moved['port']}-"
            f"{moved['max-worker-port']}"
        )
        again = self.taken(moved["port"], moved["max-worker-port"])
        if again:
            held = ", ".join(f"{port} on {node}" for node, port in again[:5])
            raise ClusterError(
                f"ports in use in both blocks tried ({held}): set GC_RAY_PORT_BASE to a free "
                f"block of {PORT_BLOCK} between {PORT_FLOOR} and {PORT_CEILING}"
            )
        self.plan.ports = moved

    def taken(self, first: int, last: int) -> list[tuple[str, int]]:
        """The ports of the range in use on any node of the job: one srun task per node."""
        reports = node_reports(self.alloc, first, last)
        if reports is None:  # no srun (run by hand): this node only
            return [(node_name(), port) for port in taken_here(first, last)]
        return reports.taken

    def node_flags(self) -> list[str]:
        own = ("port", "judge-port")  # the head's GCS port; the judge's proxy (not Ray's)
        fixed = [f"--{name}={port}" for name, port in self.ports.items() if name not in own]
        return [*fixed, "--disable-usage-stats", "--block"]

    def node_steps(self, nodes: list[str], role: str) -> list[list[str]]:
        """The steps that start Ray on ``nodes``: one per component they belong to."""
        return [self.node_step(names, role) for _, names in self.alloc.groups(nodes)]

    def node_step(self, nodes: list[str], role: str) -> list[str]:
        """Ray on ``nodes`` (all of one component), with that component's CPUs and GPUs."""
        part, _ = self.alloc.groups(nodes)[0]
        settings = {
            "role": role,
            "address": self.address,
            "temp": self.temp,
            "ray": self.ray,
            "flags": self.node_flags(),
            "nli_nodes": self.plan.nli_nodes(),
            "driver_slots": {n.name: n.drivers for n in self.plan.nodes},
            "dashboard": self.plan.dashboard,
            "logs": str(self.logs) if self.logs else None,
            "stop_file": str(self.stop_file) if self.stop_file else None,
        }
        return [
            *srun_step(nodes, part.cpus, part.gpus, part.index),
            *this_module(),
            "node",
            json.dumps(settings),
        ]

    def start(self) -> None:
        if self.stop_file is not None:  # left by a launcher of this run that was killed
            self.stop_file.unlink(missing_ok=True)
        self.steps.append(
            subprocess.Popen(self.node_step([self.alloc.head], "head"), start_new_session=True)
        )
        others = self.alloc.nodes[1:]
        if others:
            self.wait_for(1)
            for step in self.node_steps(others, "worker"):
                self.steps.append(subprocess.Popen(step, start_new_session=True))
        self.wait_for(len(self.alloc.nodes))

    def gcs_listening(self) -> bool:
        """Whether the head's GCS port takes a connection: a socket, not a ``ray status`` (a
        Python process importing Ray, about a CPU-second each) while the head starts."""
        with (
            contextlib.suppress(OSError),
            socket.create_connection((self.head, self.ports["port"]), timeout=2),
        ):
            return True
        return False

    def alive_nodes(self) -> int:
        if not self.gcs_listening():
            return 0
        done = subprocess.run(
            [self.ray, "status", f"--address={self.address}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            return 0
        text = done.stdout.split("Pending:")[0]
        return sum(1 for line in text.splitlines() if line.strip().startswith("1 node_"))

    def wait_for(self, nodes: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stopping.signal is not None:
                raise Interrupted(self.stopping.signal, "the Ray nodes to join")
            if any(step.poll() is not None for step in self.steps):
                raise ClusterError("a Ray node stopped while the cluster was starting")
            with contextlib.suppress(subprocess.SubprocessError):
                if self.alive_nodes() >= nodes:
                    say(f"Ray cluster at {self.address}: {nodes} node(s) joined")
                    return
            time.sleep(2)
        raise ClusterError(f"{nodes} Ray node(s) not up after {timeout:.0f} s")

    @property
    def stop_file(self) -> Path | None:
        """The file on the shared filesystem that asks every node's step to stop: a signal
        through ``srun`` reaches the task, but srun may then leave before the task's cleanup is
        done, the batch step ends, and Slurm kills the task midway (its logs never copied).
        Named by the job and its restart, so a requeued run never reads the last one's."""
        if self.logs is None:
            return None
        return self.logs / f".stop-{self.alloc.job}-{self.alloc.restarts}"

    def stop(self) -> None:
        """The judge's server and each node's Ray stopped together: the server ended, each node
        asked through the stop file to stop its ``ray start --block``, end what Ray left on its
        node (never ``ray stop``, which stops every Ray on a node, another job's too), copy the
        logs and remove Ray's folder, and its step waited for; a step still there after
        STEPS_WAIT seconds is signalled, then killed."""
        for server in self.servers:
            if server.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGTERM)
        asked = self.stop_file
        if asked is not None:
            with contextlib.suppress(OSError):
                make_dirs(asked.parent)
                write_atomic(asked, "stop\n")
        deadline = time.monotonic() + STEPS_WAIT
        running = [p for p in self.steps if p.poll() is None]
        if asked is None or not asked.exists():  # no shared file: the signal through srun
            for step in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(step.pid, signal.SIGTERM)
        for child in [*running, *self.servers]:
            try:
                child.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(3)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(3)
        if asked is not None:
            asked.unlink(missing_ok=True)


def node_main(argv: list[str]) -> int:
    """``job node SETTINGS``: one node's Ray, run by its ``srun`` step. The node's address is
    the one it reaches the head from (the head's own: the given one; with
    ``GC_HEAD_INTERFACE``, that interface's), its CPUs and GPUs what Slurm gave this node; Ray
    runs until the step is signalled, then whatever it left on this node is ended (a driver
    actor outlives its raylet for a while and, reparented, escapes Slurm's process tracking),
    its logs copied into the run directory and its folder removed."""
    settings = json.loads(argv[0])
    role, address = settings["role"], settings["address"]
    host, port = split_host_port(address)
    env = dict(os.environ)
    if role == "head":
        ip = host
    elif env.get("GC_HEAD_INTERFACE"):
        ip = interface_address(env["GC_HEAD_INTERFACE"])
    else:
        ip = route_source(host, port)
    from .plan import gpus_on_node

    cpus = int(env.get("SLURM_CPUS_ON_NODE") or len(os.sched_getaffinity(0)))
    gpus = gpus_on_node(env)
    node = node_name()
    temp = f"{settings['temp']}-{node[:16]}"
    dashboard = ["--include-dashboard=true", "--dashboard-host=0.0.0.0"]
    place = ["--head", f"--port={port}", *(dashboard if settings["dashboard"] else [])]
    if role == "head" and not settings["dashboard"]:
        place.append("--include-dashboard=false")
    own = {NLI_RESOURCE: 1} if node in settings["nli_nodes"] else {}
    if slots := settings.get("driver_slots", {}).get(node):
        own[DRIVER_RESOURCE] = slots
    command = [
        settings["ray"],
        "start",
        *(place if role == "head" else [f"--address={address}"]),
        f"--node-ip-address={ip}",
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--temp-dir={temp}",
        *([f"--resources={json.dumps(own)}"] if own else []),
        *settings["flags"],
    ]
    say(f"node {node}: {role} at {ip}, {cpus} CPUs, {gpus} GPUs")
    child = subprocess.Popen(command, start_new_session=True)
    asked: list[int] = []

    def stop(signum: int, frame: object) -> None:
        asked.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    stop_file = Path(settings["stop_file"]) if settings.get("stop_file") else None
    while True:
        try:
            code = child.wait(1)
            break
        except subprocess.TimeoutExpired:
            if not asked and stop_file is not None and stop_file.exists():
                stop(signal.SIGTERM, None)  # the launcher asks through the shared filesystem
            if asked and not _waits_for(child, STEP_GRACE):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
    reaped = reap(temp)
    if reaped:
        say(f"ended {reaped} Ray process(es) left on {node}")
    if settings["logs"]:
        with contextlib.suppress(OSError):
            copied = copy_logs(Path(temp), Path(settings["logs"]) / node)
            say(f"{node}: {copied} Ray/Serve/vLLM log file(s) in {settings['logs']}/{node}")
    shutil.rmtree(temp, ignore_errors=True)
    return 0 if asked else code


def copy_logs(temp: Path, into: Path) -> int:
    """Ray's logs of every session in ``temp`` (raylet, GCS, workers -- a vLLM replica's
    output is its worker's --, Serve's controller, proxy and replicas) into ``into``, newest
    first, the last LOG_FILE_CAP bytes of each, LOG_NODE_CAP in all; what was cut or left out
    is listed in ``index.txt``."""
    files = [
        path
        for session in sorted(temp.glob("session_2*"))
        for path in (session / "logs").rglob("*")
        if path.is_file() and not path.is_symlink()
    ]
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    shutil.rmtree(into, ignore_errors=True)
    make_dirs(into)
    budget, copied, index = LOG_NODE_CAP, 0, []
    for path in files:
        size = path.stat().st_size
        keep = min(size, LOG_FILE_CAP, budget)
        relative = path.relative_to(temp)
        if keep <= 0 and size:
            index.append(f"{relative}\t{size}\tleft out (the node's cap)")
            continue
        target = into / relative
        make_dirs(target.parent, within=into)
        with path.open("rb") as source:
            source.seek(size - keep)
            write_atomic(target, source.read(keep), within=into)
        budget -= keep
        copied += 1
        index.append(f"{relative}\t{size}\t" + ("whole" if keep == size else f"last {keep}"))
    write_atomic(into / "index.txt", "".join(line + "\n" for line in index), within=into)
    return copied


EXCEPTION_LINE = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")


def errors_in_logs(logs: Path, most: int = 5) -> list[tuple[str, str]]:
    """The exceptions that ended tracebacks in the copied logs of Serve and of Ray's workers (a
    replica's stderr, vLLM's engine among it), oldest file first, each once: where a judge's
    failed start says why. Log text is untrusted: only printable characters, one line each."""
    found: list[tuple[str, str]] = []
    for index in sorted(logs.glob("*/index.txt")):
        node = index.parent
        listed = [line.split("\t", 1)[0] for line in index.read_text().splitlines()]
        for relative in reversed(listed):  # the index lists newest first
            name = Path(relative)
            if "serve" not in name.parts and not name.name.startswith("worker-"):
                continue
            with contextlib.suppress(OSError):
                for text in (node / name).read_text(errors="replace").splitlines():
                    match = EXCEPTION_LINE.match(text)
                    line = match and "".join(c if c.isprintable() else "?" for c in text.strip())
                    if line and line[:300] not in {seen for _, seen in found}:
                        found.append((f"{node.name}/{relative}", line[:300]))
                        if len(found) == most:
                            return found
    return found


def reap(folder: str) -> int:
    """SIGKILL every process of this node that names ``folder`` (the job's Ray temp dir) in
    its command line or has a file in it open (a Ray worker's log): the job's, and only its."""
    mine = {os.getpid(), os.getppid()}
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        if _uses(Path("/proc") / entry, folder):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


def _uses(proc: Path, folder: str) -> bool:
    try:
        if folder.encode() in (proc / "cmdline").read_bytes():
            return True
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(folder + "/"):
                    return True
    except OSError:  # gone, or not ours to read
        return False
    return False


# ---- the services and the command ---------------------------------------------------------------


def added_flags(job: Job, address: str, judge_url: str | None) -> list[str]:
    """What the command gets: the cluster and its drivers (where it takes them), the NLI app,
    and the judge's URL, served name, key and revision (the plan refused a command that does
    not take these)."""
    plan = job.plan
    flags: list[str] = []
    if "--ray-address" in job.accepts:
        flags += ["--ray-address", address]
    if "--drivers" in job.accepts:
        flags += ["--drivers", str(plan.drivers)]
        if job.pin_nli and plan.drivers > 1 and places_drivers(job):
            flags += ["--driver-resources", json.dumps(DRIVER_PLACE)]
    if plan.nli:
        flags += ["--nli-app", plan.nli_app]
    if plan.judge and judge_url is not None:
        assert plan.served_name
        flags += judge_arguments(judge_url, plan.served_name, plan, job.judge_revision or "")
    return flags


def places_drivers(job: Job) -> bool:
    """Whether the job holds the drivers to the plan's nodes (``--driver-resources``): where
    the command takes it and gives none of its own, as a flag or in its config (then its own
    places them)."""
    given = any(
        w == "--driver-resources" or w.startswith("--driver-resources=") for w in job.command
    )
    return "--driver-resources" in job.accepts and not given and not job.own_placement


def judge_arguments(url: str, served: str, plan: Plan, revision: str) -> list[str]:
    """What the command gets to ask the judge: the head's proxy, the served name, the key, the
    weights' revision (its identity), and with adapters the prefix that names them
    (``MODEL:ADAPTER``, Serve's multiplexing)."""
    named = ["--endpoint", url, "--model", served, "--api-key-env", KEY_ENV]
    if plan.loras:
        named += ["--adapter-prefix", f"{served}:"]
    return named + ["--model-revision", revision]


def start_serve(job: Job, cluster: Cluster) -> None:
    """Serve on the cluster with its HTTP proxy on the judge's port, on every address of the
    head and of each node holding a replica, asking for the job's key (the nodes' Ray got it
    in their environment). Whoever starts Serve sets its proxy once for all apps."""
    serve = [
        job.serve,
        "start",
        f"--address={cluster.address}",
        "--http-host=0.0.0.0",
        f"--http-port={cluster.ports['judge-port']}",
        "--proxy-location=EveryNode",
    ]
    if waited(serve, "Ray Serve's start", 600, cluster.stopping) != 0:
        raise ClusterError("Ray Serve could not be started (above)")


def deploy_nli(job: Job, cluster: Cluster) -> None:
    """The NLI app on the cluster, one replica on each node the plan names (pinned there by the
    resource only those nodes offer; a share of a GPU where it shares a judge's); waited for,
    giving way to a stop signal."""
    plan = job.plan
    assert plan.nli and plan.nli_device
    serve = [
        *[job.groundcover, "serve", "--nli", plan.nli, "--nli-app", plan.nli_app],
        *["--nli-replicas", str(plan.nli_replicas), "--nli-device", plan.nli_device],
        *["--ray-address", cluster.address, "--timeout", str(int(plan.nli_start_timeout))],
    ]
    resources = plan.nli_resources(NLI_RESOURCE)
    if not job.pin_nli:  # no node offers the resource: Ray places the replicas
        resources.pop(NLI_RESOURCE)
    if resources:
        serve += ["--nli-resources", json.dumps(resources)]
    timeout = plan.nli_start_timeout + 120
    if waited(serve, "the NLI app's deploy", timeout, cluster.stopping) != 0:
        raise ClusterError(f"the NLI app {plan.nli_app} could not be deployed (above)")


def judge_serve_command(job: Job, cluster: Cluster) -> list[str]:
    """``groundcover serve`` for the plan's judge: its replicas and parallelism, its context
    length, the one start timeout, the job's key, the adapters (multiplexed on every replica),
    the GPU share beside an NLI app, and engine flags."""
    plan = job.plan
    assert plan.judge
    engine = list(plan.engine_args)
    if plan.sharing:  # vLLM may use less of a GPU an NLI replica shares
        engine += ["--gpu-memory-utilization", f"{plan.utilisation:g}"]
    return [
        *[job.groundcover, "serve", plan.judge, "--replicas", str(plan.replicas)],
        *["--ray-address", cluster.address, "--host", "0.0.0.0"],
        *["--port", str(cluster.ports["judge-port"]), "--api-key-env", KEY_ENV],
        *["--timeout", str(int(plan.judge_start_timeout))],
        *["--ready-file", str(ready_file_of(cluster))],
        *["--tensor-parallel-size", str(plan.tensor_parallel)],
        *([f"--max-model-len={plan.max_model_len}"] if plan.max_model_len else []),
        *[f"--lora={name}={path}" for name, path in plan.loras.items()],
        *([f"--gpu-share={plan.judge_gpu_share():g}"] if plan.sharing else []),
        *[f"--engine-arg={flag}" for flag in engine],
    ]


def ready_file_of(cluster: Cluster) -> Path:
    """Where ``groundcover serve`` says the judge is up: every replica healthy, not only its
    model list (which Serve's ingress answers before any replica has loaded). On the head's
    own /tmp: the server runs beside the launcher."""
    return Path(f"/tmp/gc-judge-ready-{cluster.alloc.job}-{os.getpid()}")


def serve_judge(job: Job, cluster: Cluster) -> str:
    """The judge's replicas behind one URL, served (and waited for) before the command; its
    URL: the head's proxy, which every node reaches and which routes to the replicas on every
    node. Stopped with the cluster."""
    plan = job.plan
    assert plan.judge
    port = cluster.ports["judge-port"]
    ready = ready_file_of(cluster)
    ready.unlink(missing_ok=True)
    cluster.servers.append(
        subprocess.Popen(judge_serve_command(job, cluster), start_new_session=True)
    )
    asked = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models",
        headers={"Authorization": f"Bearer {os.environ[KEY_ENV]}"},
    )
    # `serve` gives up after its own timeout and says why; this wait is a little longer
    deadline = time.monotonic() + plan.judge_start_timeout + 120
    try:
        while time.monotonic() < deadline:
            if cluster.stopping.signal is not None:
                raise Interrupted(cluster.stopping.signal, "the judge's start")
            if cluster.servers[-1].poll() is not None:
                raise ClusterError("the judge's server stopped while starting (above)")
            if ready.is_file():
                with contextlib.suppress(OSError, ValueError, LookupError):
                    with urllib.request.urlopen(asked, timeout=5) as answer:
                        served = json.loads(answer.read())["data"][0]["id"]
                    url = f"http://{host_port(cluster.head, port)}/v1"
                    say(f"the judge {plan.judge}: {plan.replicas} replica(s) of {served} at {url}")
                    return url
            time.sleep(5)
    finally:
        ready.unlink(missing_ok=True)
    raise ClusterError(f"the judge's server did not answer within {plan.judge_start_timeout:.0f} s")


# what the judge's weights are, by content (a directory's digest, a hub id's commit), as the
# run would find them had it started the model itself
REVISION_OF = """
import sys
from groundcover.serving.content import model_content
from groundcover.serving.launch.registry import model_source, resolve
from groundcover.serving.files import write_atomic
from pathlib import Path
found = model_content(model_source(resolve(sys.argv[1])))["revision"]
write_atomic(Path(sys.argv[2]), found or "")
"""


def judge_revision(model: str, given: str | None, stopping: Stopping) -> str:
    """The judge's weights by content or revision, found before anything starts: Ray Serve's
    model list names no weights, and the head's URL changes with the job's ports and nodes (a
    requeued or resubmitted job could then not continue its run). A child process, so that the
    time limit's warning stops a long digest at once."""
    if given:
        return given
    out = Path(f"/tmp/gc-revision-{os.getpid()}")
    try:
        probe = [sys.executable, "-c", REVISION_OF, model, str(out)]
        code = waited(probe, "the judge's revision", 3600, stopping)
        revision = out.read_text().strip() if out.is_file() else ""
    finally:
        out.unlink(missing_ok=True)
    if code != 0 or not revision:
        raise ClusterError(
            f"no revision found for the judge {model} (its weights not fetched?): fetch them "
            "(groundcover cluster prefetch), or give --judge-revision"
        )
    say(f"the judge {model} is known by its weights: {revision}")
    return revision


def ray_token_found() -> bool:
    """Whether Ray will find a token (its rules: the variable, else the file the path variable
    names, else ``~/.ray/auth_token``), seen without starting a Python that imports Ray."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(named).expanduser().is_file() if named else DEFAULT_TOKEN.is_file()


def ensure_ray_token() -> Path | None:
    """Ray's token, made where none is found (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``): ``ray start --head`` in token mode refuses to start without one and
    never makes it. Written readable by its owner only (0600, its folder 0700): the token lets
    anyone who reads it run code on the cluster. Never printed."""
    if ray_token_found():
        return None
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named).expanduser() if named else DEFAULT_TOKEN
    make_dirs(path.parent, mode=0o700)
    write_atomic(path, secrets.token_hex(32), permissions=0o600)
    return path


def prepare_environment(plan: Plan, tiktoken: Path | None) -> None:
    """What every process the job starts inherits (srun passes the environment on to each
    node's step): Ray's token mode, the judge's proxy key and callback, the settings every
    node's Ray needs, and gpt-oss's tiktoken files where they were fetched."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token":  # a site that turned it off gets no token file
        ensure_ray_token()
    if plan.judge:  # in the environment of every node's Ray: its proxies ask for it
        os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
        os.environ[CALLBACK_ENV] = CALLBACK
    for name, value in CLUSTER_ENV.items():
        os.environ.setdefault(name, value)
    if tiktoken is not None and tiktoken.is_dir():
        os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(tiktoken))


def requeue(alloc: Allocation, most: int, code: int) -> int:
    """The time limit is near and the run is not done: the job goes back into the queue and
    continues where it stopped (the same script, the same --run-dir), at most ``most`` times
    (``SLURM_RESTART_COUNT`` says how often it was). Needs ``#SBATCH --requeue`` where the
    site's default is not to requeue."""
    if alloc.restarts >= most:
        say(
            f"job {alloc.requeue_id} was requeued {alloc.restarts} time(s), --max-requeues "
            f"{most}: not requeued again, it ends FAILED (the run stays resumable: submit the "
            "script again, or give more --time or --max-requeues)"
        )
        return code
    say(
        f"requeueing job {alloc.requeue_id} ({alloc.restarts + 1} of at most {most}): it "
        "continues where it stopped"
    )
    done = subprocess.run(
        ["scontrol", "requeue", alloc.requeue_id], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        say(f"scontrol requeue failed: {done.stderr.strip()}; submit the script again")
    return code


def wait(child: subprocess.Popen[bytes], stopping: Stopping) -> int:
    """The command's exit code; once a stop is asked, ``GRACE`` seconds then SIGKILL."""
    asked_at: float | None = None
    while True:
        try:
            return child.wait(1)
        except subprocess.TimeoutExpired:
            pass
        if stopping.signal is not None:
            asked_at = asked_at or time.monotonic()
            if time.monotonic() - asked_at > GRACE:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)


def run_dir_of(command: list[str]) -> Path | None:
    """The command's ``--run-dir`` (the last one given wins, as for the CLI)."""
    found = None
    for k, word in enumerate(command):
        if word == "--run-dir" and k + 1 < len(command):
            found = command[k + 1]
        elif word.startswith("--run-dir="):
            found = word.split("=", 1)[1]
    return Path(found) if found else None


def dry_run_command(job: Job, cluster: Cluster) -> None:
    """The command's own ``--dry-run``, with every flag it will get (the judge's URL as the
    job will serve it), before any node's Ray starts: a command that cannot run stops the job
    here, with its own line, and no judge is loaded for it."""
    if "--dry-run" not in job.accepts:  # a command without one (serve, index build): checked only
        say("the command has no --dry-run: its flags were checked, nothing more")
        return
    url = None
    if job.plan.judge:
        url = f"http://{host_port(cluster.head, cluster.ports['judge-port'])}/v1"
    asked = [*job.command, *added_flags(job, cluster.address, url), "--dry-run"]
    say("the command's dry run: " + shlex.join(asked))
    if waited(asked, "the command's dry run", 600, cluster.stopping) != 0:
        raise ClusterError("the command's dry run failed (above): nothing was started")


def run(job: Job, tiktoken: Path | None) -> int:
    """The job, from the plan to its end (its exit code: the command's, or 1 / 128+N)."""
    alloc, plan = job.allocation, job.plan
    stopping = Stopping()
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    prepare_environment(plan, tiktoken)
    each = f"{alloc.step_cpus} CPUs each"
    say(f"job {alloc.job}: {len(alloc.nodes)} node(s) {','.join(alloc.nodes)}, {each}")
    run_dir = run_dir_of(job.command)
    submitted = Path(os.environ.get("SLURM_SUBMIT_DIR") or ".")
    logs = run_dir / "cluster-logs" if run_dir else submitted / f"cluster-logs-{alloc.job}"
    cluster: Cluster | None = None
    code = 1
    try:
        if plan.judge:
            job.judge_revision = judge_revision(plan.judge, job.judge_revision, stopping)
        head = head_address(dict(os.environ), len(alloc.nodes) > 1)
        cluster = Cluster(alloc, plan, job.ray, stopping, head, logs)
        cluster.choose_ports(fixed=job.port_base is not None)
        dry_run_command(job, cluster)
        within = logs.parent  # the run directory (or where the job was submitted): named
        make_dirs(within)
        make_dirs(logs, within=within)
        plan_text = json.dumps(plan.as_json(), indent=1) + "\n"
        write_atomic(logs / "plan.json", plan_text, within=within)
        cluster.start()
        command = run_services(job, cluster)
        say("running: " + shlex.join(command))
        stopping.child = subprocess.Popen(command, start_new_session=True)
        if stopping.signal is not None:  # a signal between the start and now
            os.killpg(stopping.child.pid, signal.SIGTERM)
        code = wait(stopping.child, stopping)
        say(f"the command ended with exit code {code}")
    except Interrupted as stop:
        say(f"{signal.Signals(stop.signum).name} while waiting for {stop.during}: stopped waiting")
        code = 128 + stop.signum
    except ClusterError as failed:
        say(f"error: {failed}")
        code = 1
        if cluster is not None:
            finish(cluster, logs, failed_start=stopping.child is None)
            cluster = None
    finally:
        if cluster is not None:
            finish(cluster, logs, failed_start=False)
    if stopping.signal == signal.SIGUSR1 and code != 0 and plan.requeue:
        return requeue(alloc, plan.max_requeues, code)
    return code


def run_services(job: Job, cluster: Cluster) -> list[str]:
    """Serve with the judge's proxy, the NLI app, the judge; the command with what it gets."""
    plan = job.plan
    if plan.judge:  # Serve with the judge's proxy, before the NLI app can start it without
        start_serve(job, cluster)
    if plan.nli:
        deploy_nli(job, cluster)
    url = serve_judge(job, cluster) if plan.judge else None
    return [*job.command, *added_flags(job, cluster.address, url)]


def finish(cluster: Cluster, logs: Path, failed_start: bool) -> None:
    """Ray stopped on every node; after a failed start, the errors the copied logs hold
    (Serve's reason often points elsewhere: "see root cause above")."""
    cluster.stop()
    say("Ray stopped on every node")
    if failed_start:
        for where, line in errors_in_logs(logs):
            say(f"an error in {where}: {line}")


# ---- on a Ray cluster that already runs (a KubeRay RayJob) ----------------------------------

SERVE_PORT = 8000  # the Serve proxy's port on a KubeRay head (its service declares it)
RAY_NODES = """
import json, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
print(json.dumps([{"ip": n["NodeManagerAddress"], "alive": n["Alive"],
                   "resources": n["Resources"]} for n in ray.nodes()]))
"""


def nodes_from_ray(listing: list[dict[str, Any]]) -> dict[str, int]:
    """Each live node of a running Ray cluster that can hold work, by address, with its GPUs:
    a node that offers no CPU (KubeRay's head, ``num-cpus: "0"``) holds no driver or replica."""
    found: dict[str, int] = {}
    for node in listing:
        resources = node.get("resources") or {}
        if node.get("alive") and resources.get("CPU", 0) > 0:
            found[str(node["ip"])] = int(resources.get("GPU", 0))
    return found


def ray_nodes(stopping: Stopping | None = None) -> dict[str, int]:
    """The nodes of the Ray cluster this process runs in (``RAY_ADDRESS``): a child process
    asks Ray, so this one never becomes a driver that lingers."""
    try:
        env = {"RAY_AUTH_MODE": "token"} | dict(os.environ)  # as the job's own processes
        done = subprocess.run(
            [sys.executable, "-c", RAY_NODES], capture_output=True, text=True, env=env, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"the Ray cluster's nodes could not be read: {exc}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ClusterError(f"the Ray cluster's nodes could not be read: {tail[0]}")
    return nodes_from_ray(json.loads(done.stdout.strip().splitlines()[-1]))


def head_service() -> str:
    """How the drivers reach the head's Serve proxy on KubeRay: its service's name (the pod's
    address changes with a restart; ``hostname -i`` may give IPv6), else this node's address."""
    cluster, namespace = os.environ.get("RAY_CLUSTER_NAME"), os.environ.get("POD_NAMESPACE")
    if cluster and namespace:
        return f"{cluster}-head-svc.{namespace}.svc.cluster.local"
    given = os.environ.get("RAY_ADDRESS", "").split("://")[-1]
    if given and given != "auto":  # the head's GCS address, which every node reaches
        return split_host_port(given)[0] if ":" in given else given
    return head_address(dict(os.environ), several_nodes=True)


class RayCluster(Cluster):
    """The cluster a RayJob runs in: KubeRay started it and ends it; the job serves on it and
    removes only what it deployed."""

    @property
    def address(self) -> str:
        return "auto"

    def stop(self) -> None:
        for server in self.servers:  # its app is deleted as the server stops
            if server.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGTERM)
        for server in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(STEPS_WAIT)
            end_group(server)


def stop_nli_app(job: Job) -> None:
    """The NLI app this job deployed, deleted (a warm app someone else runs is never named)."""
    if job.plan.nli:
        stop = [job.groundcover, "serve", "--nli-app", job.plan.nli_app, "--stop"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*stop, "--ray-address", "auto"], timeout=120)


def run_on_ray(job: Job, tiktoken: Path | None) -> int:
    """The job inside a Ray cluster that runs already (a KubeRay RayJob's entrypoint): the
    plan over its nodes, the judge identified, the command's dry run, Serve with its proxy,
    the NLI app, the judge (ready when Serve reports its app RUNNING: every replica healthy),
    the command, and on every exit the judge and the NLI app removed."""
    plan = job.plan
    stopping = Stopping()
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    if plan.judge and not os.environ.get(KEY_ENV):  # every pod's proxy reads it from the secret
        say(f"error: no key for the judge: create the secret groundcover-serve-key ({KEY_ENV})")
        return 1
    prepare_environment(plan, tiktoken)
    plan.ports = {**plan.ports, "judge-port": int(os.environ.get("GC_SERVE_PORT") or SERVE_PORT)}
    try:
        head = head_service()
    except ClusterError as failed:
        say(f"error: {failed}")
        return 1
    cluster = RayCluster(job.allocation, plan, job.ray, stopping, head)
    code = 1
    try:
        if plan.judge:
            job.judge_revision = judge_revision(plan.judge, job.judge_revision, stopping)
        dry_run_command(job, cluster)
        command = run_services(job, cluster)
        say("running: " + shlex.join(command))
        stopping.child = subprocess.Popen(command, start_new_session=True)
        if stopping.signal is not None:
            os.killpg(stopping.child.pid, signal.SIGTERM)
        code = wait(stopping.child, stopping)
        say(f"the command ended with exit code {code}")
    except Interrupted as stop:
        say(f"{signal.Signals(stop.signum).name} while waiting for {stop.during}: stopped waiting")
        code = 128 + stop.signum
    except ClusterError as failed:
        say(f"error: {failed}")
    finally:
        cluster.stop()
        stop_nli_app(job)
        say("the judge and the NLI app removed")
    return code


def main(argv: list[str]) -> int:
    """``python -m groundcover.serving.cluster.job node SETTINGS | ports FIRST LAST``: what
    each node's ``srun`` step runs."""
    if argv[:1] == ["node"]:
        return node_main(argv[1:])
    if argv[:1] == ["ports"]:
        return ports_main(argv[1:])
    print("usage: python -m groundcover.serving.cluster.job node SETTINGS | ports FIRST LAST")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
