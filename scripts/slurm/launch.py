"""One groundcover command on a Slurm allocation: a Ray cluster over its nodes, the command
spread over them, and everything stopped however the job ends.

``groundcover.sbatch`` calls this on the allocation's first node (the batch step)::

    launch.py [--drivers-per-node K] [--judge MODEL --replicas auto|N --gpus-per-replica G]
              [--nli CHECKPOINT --nli-replicas auto|N] -- groundcover eval ... --run-dir runs/x

1. The Ray head starts on the first node and a worker on every other one, each as one
   ``srun`` task (``ray start --block``: the step is the node's Ray, and ends with it). Each
   node offers Ray the CPUs and GPUs Slurm gave it. The ports come from the job id, so two jobs
   that share a node do not meet; Ray's files live under ``/tmp/gc-ray-<job>``.
2. With ``--nli``, the NLI app is deployed on the cluster (``groundcover serve --nli``) on
   CUDA when the allocation has GPUs, and the command is given ``--nli-app``.
3. With ``--judge MODEL``, the judge is served once for every driver: ``groundcover serve MODEL
   --replicas R`` (Ray Serve LLM; ``auto``: the allocation's GPUs left after the NLI app,
   divided by ``--gpus-per-replica``) on a port of the job's block, and the command is given
   ``--endpoint http://127.0.0.1:PORT/v1 --model MODEL`` (each node's Serve proxy answers on
   that port, so every driver asks the one beside it).
4. The command runs with ``--ray-address`` and ``--drivers N`` (N = nodes x
   ``--drivers-per-node``) added.
5. At the end -- the command done, ``scancel`` (SIGTERM), the time limit's warning (SIGUSR1 with
   ``#SBATCH --signal=B:USR1@300``) or Ctrl-C -- the command is asked to stop (SIGTERM: what is
   recorded stays, the run resumes), then each node's ``srun`` step is ended, and with it that
   node's Ray (never ``ray stop``, which would stop another job's Ray on a shared node).
   Submitting the same script again continues the run (same ``--run-dir``).

With ``GC_GRID`` set to a file of argument lines (a paper grid: one run per line), an array
task runs line ``SLURM_ARRAY_TASK_ID`` of it after the command given here.

Only the standard library and the commands ``ray``, ``groundcover``, ``srun`` and ``scontrol``
are used: the launcher runs before anything is imported on the nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
GRACE = 20.0  # seconds the command has to stop once asked (Slurm's KillWait is 30 by default)
STEP_GRACE = 5.0  # seconds each node's Ray step has to stop before it is killed


class Allocation:
    """What Slurm gave this job, read from its environment."""

    def __init__(self, env: dict[str, str]):
        self.job = env.get("SLURM_JOB_ID") or str(os.getpid())
        nodelist = env.get("SLURM_JOB_NODELIST") or socket.gethostname()
        self.nodes = expand_nodes(nodelist)
        self.cpus = int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
        self.gpus = gpus_on_node(env)
        self.array_task = env.get("SLURM_ARRAY_TASK_ID")

    @property
    def head(self) -> str:
        return self.nodes[0]

    def ports(self, base: int | None = None) -> dict[str, int]:
        """Ray's ports for this job: a block of 400 below Linux's ephemeral range (where the
        kernel hands out ports for outgoing connections), chosen by the job id; a block with a
        port in use on this node gives way to the next one (``GC_RAY_PORT_BASE`` fixes the
        block instead)."""
        if base is not None:
            return block_ports(base)
        blocks = (PORT_CEILING - PORT_FLOOR) // PORT_BLOCK
        first = int(self.job) % blocks
        for k in range(blocks):
            found = block_ports(PORT_FLOOR + (first + k) % blocks * PORT_BLOCK)
            if not any(port_taken(p) for p in range(found["port"], found["max-worker-port"] + 1)):
                return found
        raise SystemExit(
            f"no block of {PORT_BLOCK} free ports between {PORT_FLOOR} and {PORT_CEILING} on "
            "this node: set GC_RAY_PORT_BASE"
        )


PORT_FLOOR, PORT_CEILING = 10000, 32768  # Linux's ephemeral range starts at 32768
PORT_BLOCK = 400


def port_taken(port: int) -> bool:
    """Whether something on this node holds ``port`` (a bind on every address fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return True
    return False


def block_ports(start: int) -> dict[str, int]:
    """The ports of the block that starts at ``start``: Ray's own, the judge's proxy, and the
    workers' range (the rest of the block)."""
    names = (
        "port",
        "dashboard-port",  # the minimal dashboard runs even without --include-dashboard
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-grpc-port",
        "dashboard-agent-listen-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    found = {name: start + k for k, name in enumerate(names)}
    found["judge-port"] = start + 19  # the judge's Serve proxy (``--judge``)
    return found | {"min-worker-port": start + 20, "max-worker-port": start + PORT_BLOCK - 1}


def expand_nodes(nodelist: str) -> list[str]:
    """``node[01-03],gpu7`` as Slurm expands it (``scontrol show hostnames``)."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        names = done.stdout.split()
    except (OSError, subprocess.SubprocessError):
        names = [] if any(c in nodelist for c in "[],") else [nodelist]
    if not names:
        raise SystemExit(f"launch: cannot expand the node list {nodelist!r} (scontrol)")
    return names


def gpus_on_node(env: dict[str, str]) -> int:
    """GPUs Slurm gave each node: SLURM_GPUS_ON_NODE, else the visible devices."""
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def node_address(host: str) -> str:
    """The head's address as the other nodes reach it."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class Cluster:
    """Ray over the allocation: one ``srun`` step per node, each running ``ray start --block``."""

    def __init__(
        self, alloc: Allocation, ray: str, port_base: int | None, stopping: Stopping
    ) -> None:
        self.alloc = alloc
        self.stopping = stopping
        self.ray = ray
        self.ports = alloc.ports(port_base)
        self.temp = f"/tmp/gc-ray-{alloc.job}"  # Ray's socket paths must stay short
        self.address = f"{node_address(alloc.head)}:{self.ports['port']}"
        self.steps: list[subprocess.Popen] = []
        self.servers: list[subprocess.Popen] = []  # the judge's ``groundcover serve``

    def node_flags(self) -> list[str]:
        own = ("port", "judge-port")  # the head's GCS port; the judge's proxy (not Ray's)
        fixed = [f"--{name}={port}" for name, port in self.ports.items() if name not in own]
        return [
            *fixed,
            f"--num-cpus={self.alloc.cpus}",
            f"--num-gpus={self.alloc.gpus}",
            f"--temp-dir={self.temp}",
            "--disable-usage-stats",
            "--block",
        ]

    def start(self) -> None:
        head = [
            *srun(1, [self.alloc.head]),
            self.ray,
            "start",
            "--head",
            f"--port={self.ports['port']}",
            "--include-dashboard=false",
            *self.node_flags(),
        ]
        self.steps.append(subprocess.Popen(head, start_new_session=True))
        others = self.alloc.nodes[1:]
        if others:
            self.wait_for(1)
            worker = [
                *srun(len(others), others),
                self.ray,
                "start",
                f"--address={self.address}",
                *self.node_flags(),
            ]
            self.steps.append(subprocess.Popen(worker, start_new_session=True))
        self.wait_for(len(self.alloc.nodes))

    def alive_nodes(self) -> int:
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
                raise SystemExit(128 + self.stopping.signal)
            if any(step.poll() is not None for step in self.steps):
                raise SystemExit("launch: a Ray node stopped while the cluster was starting")
            with contextlib.suppress(subprocess.SubprocessError):
                if self.alive_nodes() >= nodes:
                    say(f"Ray cluster at {self.address}: {nodes} node(s)")
                    return
            time.sleep(2)
        raise SystemExit(f"launch: {nodes} Ray node(s) not up after {timeout:.0f} s")

    def stop(self) -> None:
        """Each node's Ray stopped by ending its step: ``ray start --block`` stops the processes
        of its own node when signalled (never ``ray stop``, which stops every Ray on a node,
        another job's too). ``srun`` passes the SIGTERM on; one still there after
        ``STEP_GRACE`` seconds is killed, and Slurm ends its tasks (all within Slurm's
        KillWait, 30 s by default, after which Slurm kills the launcher too)."""
        for server in self.servers:  # ``serve`` deletes its app when it stops
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
        for server in self.servers:
            try:
                server.wait(STEP_GRACE)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
        for step in self.steps:
            if step.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(step.pid, signal.SIGTERM)
        deadline = time.monotonic() + STEP_GRACE
        for step in self.steps:
            try:
                step.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(step.pid, signal.SIGKILL)
                step.wait(10)
        # Ray workers outlive their raylet for a while (a driver actor goes on with its items)
        # and, reparented, escape a process-tree tracker: this node's are ended here; another
        # node's by Slurm (proctrack/cgroup ends every process of the job)
        reaped = reap(self.temp)
        if reaped:
            say(f"ended {reaped} Ray process(es) left on {socket.gethostname()}")


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


def srun(tasks: int, nodes: list[str]) -> list[str]:
    """One task per node on ``nodes``, sharing the allocation with the other steps."""
    return [
        "srun",
        f"--nodes={len(nodes)}",
        f"--ntasks={tasks}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--overlap",
        "--kill-on-bad-exit=0",
    ]


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def replicas_for(value: str, alloc: Allocation, nli_gpus: int, per_replica: int) -> int:
    if value != "auto":
        return int(value)
    free = alloc.gpus * len(alloc.nodes) - nli_gpus
    if free < per_replica:
        raise SystemExit(
            f"launch: --replicas auto: {free} GPU(s) left for the judge, {per_replica} per replica"
        )
    return free // per_replica


def grid_line(path: Path, task: str | None) -> list[str]:
    """The array task's line of a grid file (blank lines and # comments skipped)."""
    if task is None:
        raise SystemExit("launch: GC_GRID is set but this is no array job (sbatch --array)")
    lines = [
        line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    k = int(task)
    if not 0 <= k < len(lines):
        raise SystemExit(f"launch: {path} has {len(lines)} runs; array task {k} has none")
    return shlex.split(lines[k])


def command_for(args: argparse.Namespace, alloc: Allocation, cluster: Cluster) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit("launch: give the groundcover command after --")
    grid = os.environ.get("GC_GRID")
    if grid:
        command += grid_line(Path(grid), alloc.array_task)
    drivers = len(alloc.nodes) * args.drivers_per_node
    command += ["--ray-address", cluster.address, "--drivers", str(drivers)]
    nli_gpus = 0
    if args.nli:
        nli_gpus = deploy_nli(args, alloc, cluster)
        command += ["--nli-app", args.nli_app]
    if args.judge:
        count = replicas_for(args.replicas or "auto", alloc, nli_gpus, args.gpus_per_replica)
        command += serve_judge(args, count, cluster)
    return command


def serve_judge(args: argparse.Namespace, replicas: int, cluster: Cluster) -> list[str]:
    """The judge's replicas behind one URL, served (and waited for) before the command; the
    arguments that point the command at it. Stopped with the cluster."""
    port = cluster.ports["judge-port"]
    serve = [
        args.groundcover,
        "serve",
        args.judge,
        "--replicas",
        str(replicas),
        "--ray-address",
        cluster.address,
        "--port",
        str(port),
    ]
    cluster.servers.append(subprocess.Popen(serve, start_new_session=True))
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 3600  # a large model's first load
    while time.monotonic() < deadline:
        if cluster.stopping.signal is not None:
            raise SystemExit(128 + cluster.stopping.signal)
        if cluster.servers[-1].poll() is not None:
            raise SystemExit("launch: the judge's server stopped while starting (serve.log)")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/models", timeout=5).close()
            say(f"the judge {args.judge}: {replicas} replica(s) at {url}")
            return ["--endpoint", url, "--model", args.judge]
        time.sleep(5)
    raise SystemExit("launch: the judge's server did not answer within an hour")


def deploy_nli(args: argparse.Namespace, alloc: Allocation, cluster: Cluster) -> int:
    """The NLI app on the cluster; the GPUs it takes (one per replica on CUDA)."""
    on_gpu = alloc.gpus > 0
    replicas = (
        int(args.nli_replicas)
        if args.nli_replicas != "auto"
        else (len(alloc.nodes) if on_gpu else 1)
    )
    serve = [
        args.groundcover,
        "serve",
        "--nli",
        args.nli,
        "--nli-app",
        args.nli_app,
        "--nli-replicas",
        str(replicas),
        "--nli-device",
        "cuda" if on_gpu else "cpu",
        "--ray-address",
        cluster.address,
    ]
    if subprocess.run(serve, timeout=1800).returncode != 0:
        raise SystemExit(f"launch: the NLI app {args.nli_app} could not be deployed (above)")
    return replicas if on_gpu else 0


class Stopping:
    """The first stop signal asks the command to stop; the launcher then cleans up."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.child: subprocess.Popen | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.signal is None:
            self.signal = signum
            say(f"{signal.Signals(signum).name}: stopping the command (the run stays resumable)")
            if self.child is not None and self.child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.child.pid, signal.SIGTERM)
        else:  # asked again: end it now (what is recorded stays)
            if self.child is not None and self.child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.child.pid, signal.SIGKILL)


def run(args: argparse.Namespace) -> int:
    # Ray's token authentication, on for every process the launcher starts: the token is
    # ~/.ray/auth_token (made by the head if missing), so every node needs the same home (or
    # RAY_AUTH_TOKEN set in the job's environment)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    alloc = Allocation(dict(os.environ))
    port_base = int(os.environ["GC_RAY_PORT_BASE"]) if os.environ.get("GC_RAY_PORT_BASE") else None
    stopping = Stopping()
    cluster = Cluster(alloc, args.ray, port_base, stopping)
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    each = f"{alloc.cpus} CPUs, {alloc.gpus} GPUs each"
    say(f"job {alloc.job}: {len(alloc.nodes)} node(s) {','.join(alloc.nodes)}, {each}")
    try:
        cluster.start()
        if stopping.signal is not None:
            return 128 + stopping.signal
        command = command_for(args, alloc, cluster)
        say("running: " + shlex.join(command))
        stopping.child = subprocess.Popen(command, start_new_session=True)
        if stopping.signal is not None:  # a signal between the start and now
            os.killpg(stopping.child.pid, signal.SIGTERM)
        code = wait(stopping.child, stopping)
        say(f"the command ended with exit code {code}")
        return code
    finally:
        cluster.stop()
        say("Ray stopped on every node")


def wait(child: subprocess.Popen, stopping: Stopping) -> int:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bindir = Path(sys.executable).parent
    parser.add_argument("--drivers-per-node", type=int, default=1)
    parser.add_argument("--judge", help="serve this model once for every driver (Ray Serve LLM)")
    parser.add_argument("--replicas", help="with --judge: N replicas, or auto (the GPUs left)")
    parser.add_argument("--gpus-per-replica", type=int, default=1)
    parser.add_argument("--nli", help="an NLI cross-encoder to deploy as a Ray Serve app")
    parser.add_argument("--nli-app", default="groundcover-nli")
    parser.add_argument("--nli-replicas", default="auto")
    parser.add_argument("--ray", default=str(bindir / "ray"), help="the ray command")
    parser.add_argument("--groundcover", default=str(bindir / "groundcover"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
