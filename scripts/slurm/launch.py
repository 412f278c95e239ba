"""One groundcover command on a Slurm allocation: a Ray cluster over its nodes, the command
spread over them, and everything stopped however the job ends.

``groundcover.sbatch`` calls this on the allocation's first node (the batch step)::

    launch.py [--drivers-per-node K] [--judge MODEL --replicas auto|N --gpus-per-replica G]
              [--nli CHECKPOINT --nli-replicas auto|N] [--no-requeue]
              -- groundcover eval ... --run-dir runs/x

1. The head's address is the first node's, as ``srun hostname --ip-address`` gives it there
   (``GC_HEAD_ADDRESS`` overrides it: a node whose name resolves to 127.0.1.1, or several
   networks). Each node runs one ``srun`` step with the CPUs (and GPUs) the job has there:
   ``launch.py node``, which finds the node's own address (the one it reaches the head from),
   reads its own resources and runs ``ray start --block`` with ``--node-ip-address``; when Ray
   ends it ends whatever Ray left on its node. The ports come from the job id, so two jobs
   that share a node do not meet; Ray's files live under ``/tmp/gc-ray-<job>-<node>``.
2. With ``--judge``, Serve is started first with its HTTP proxy on the judge's port of every
   node that holds a replica and of the head, behind a key made for the job (so the NLI app,
   which needs no proxy, and the judge can share it in either order).
3. With ``--nli``, the NLI app is deployed on the cluster (``groundcover serve --nli``) on
   CUDA when the allocation has GPUs, and the command is given ``--nli-app``.
4. With ``--judge MODEL``, the judge is served once for every driver: ``groundcover serve MODEL
   --replicas R`` (Ray Serve LLM; ``auto``: the allocation's GPUs left after the NLI app,
   divided by ``--gpus-per-replica``, which is also each replica's tensor parallelism), and the
   command is given ``--endpoint http://HEAD:PORT/v1 --model MODEL --api-key-env ...``: every
   driver asks the head's proxy, which routes to the replicas on every node.
5. The command runs with ``--ray-address`` and ``--drivers N`` (N = nodes x
   ``--drivers-per-node``) added.
6. At the end -- the command done, ``scancel`` (SIGTERM), the time limit's warning (SIGUSR1 with
   ``#SBATCH --signal=B:USR1@300``) or Ctrl-C -- the command is asked to stop (SIGTERM: what is
   recorded stays, the run resumes), then each node's ``srun`` step is ended, and with it that
   node's Ray (never ``ray stop``, which would stop another job's Ray on a shared node). After
   the time limit's warning the job is requeued (``scontrol requeue``; ``--no-requeue`` or
   ``GC_REQUEUE=0`` turns it off) and continues where it stopped; submitting the same script
   again does the same by hand (same ``--run-dir``).

With ``GC_GRID`` set to a file of argument lines (a paper grid: one run per line), an array
task runs line ``SLURM_ARRAY_TASK_ID`` of it after the command given here.

Only the standard library and the commands ``ray``, ``serve``, ``groundcover``, ``srun`` and
``scontrol`` are used: the launcher runs before anything is imported on the nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import secrets
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
STEP_GRACE = 5.0  # seconds a node's Ray has to stop before it is killed
# the judge's proxy asks for a key made for the job; the names are serving.cluster.serve_app's
# (this script imports nothing of ours: a test holds the two equal)
KEY_ENV = "GROUNDCOVER_SERVE_API_KEY"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "groundcover.serving.cluster.serve_app:proxy_middlewares"


class Allocation:
    """What Slurm gave this job, read from its environment."""

    def __init__(self, env: dict[str, str]):
        self.job = env.get("SLURM_JOB_ID") or str(os.getpid())
        nodelist = env.get("SLURM_JOB_NODELIST") or socket.gethostname()
        self.nodes = expand_nodes(nodelist)
        self.cpus = int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
        self.gpus = gpus_on_node(env)
        self.array_task = env.get("SLURM_ARRAY_TASK_ID")
        # what each node's step asks for: the job's CPUs per task (or the fewest any node has),
        # and its GPUs per node where the job asked for them by node
        self.step_cpus = int(env.get("SLURM_CPUS_PER_TASK") or fewest_cpus(env) or self.cpus)
        self.step_gpus = env.get("SLURM_GPUS_PER_NODE")
        array = env.get("SLURM_ARRAY_JOB_ID")
        self.requeue_id = f"{array}_{self.array_task}" if array and self.array_task else self.job

    @property
    def head(self) -> str:
        return self.nodes[0]

    def first_block_start(self) -> int:
        """Where the job's own block of ports starts (the one tried first): the job id picks
        one of the blocks between PORT_FLOOR and PORT_CEILING."""
        blocks = (PORT_CEILING - PORT_FLOOR) // PORT_BLOCK
        return PORT_FLOOR + int(self.job) % blocks * PORT_BLOCK

    def ports(self, base: int | None = None) -> dict[str, int]:
        """Ray's ports for this job: a block of 400 below Linux's ephemeral range (where the
        kernel hands out ports for outgoing connections), chosen by the job id; a block with a
        port in use on this node gives way to the next one (``GC_RAY_PORT_BASE`` fixes the
        block instead)."""
        if base is not None:
            return block_ports(base)
        blocks = (PORT_CEILING - PORT_FLOOR) // PORT_BLOCK
        first = (self.first_block_start() - PORT_FLOOR) // PORT_BLOCK
        for k in range(blocks):
            found = block_ports(PORT_FLOOR + (first + k) % blocks * PORT_BLOCK)
            if not any(port_taken(p) for p in range(found["port"], found["max-worker-port"] + 1)):
                return found
        raise SystemExit(
            f"no block of {PORT_BLOCK} free ports between {PORT_FLOOR} and {PORT_CEILING} on "
            "this node: set GC_RAY_PORT_BASE"
        )


def fewest_cpus(env: dict[str, str]) -> int | None:
    """The fewest CPUs the job has on any node: SLURM_JOB_CPUS_PER_NODE reads ``16(x2),8``."""
    counts = [
        int(part.split("(")[0])
        for part in env.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")
        if part.split("(")[0].isdigit()
    ]
    return min(counts) if counts else None


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
    """GPUs Slurm gave this node: SLURM_GPUS_ON_NODE, else the visible devices."""
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def head_address(alloc: Allocation, env: dict[str, str]) -> str:
    """The address the other nodes reach the head at: ``GC_HEAD_ADDRESS``, else the first
    address ``hostname --ip-address`` gives on the head node (as Ray's own Slurm guide takes
    it) that is not loopback; a one-node job may stay on loopback."""
    if env.get("GC_HEAD_ADDRESS"):
        return env["GC_HEAD_ADDRESS"]
    ask = [*srun_step([alloc.head], 1), "hostname", "--ip-address"]
    try:
        done = subprocess.run(ask, capture_output=True, text=True, timeout=120)
        found = done.stdout.split()
    except (OSError, subprocess.SubprocessError):
        found = []
    if not found:  # no srun (run by hand): this node's own resolution
        with contextlib.suppress(OSError):
            found = socket.gethostbyname_ex(socket.gethostname())[2]
    outward = [a for a in found if not _loopback(a)]
    if outward:
        return outward[0]
    if len(alloc.nodes) == 1 and found:
        return found[0]
    raise SystemExit(
        f"launch: {alloc.head} resolves only to {' '.join(found) or 'nothing'} (a loopback "
        "hosts entry?): set GC_HEAD_ADDRESS to the address the other nodes reach it at"
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def route_source(host: str, port: int) -> str:
    """This node's address on the way to ``host``: the one the kernel would send from (a UDP
    socket's connect sends nothing). On a node with a management and an InfiniBand interface
    it is the one on the head's network."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


class Cluster:
    """Ray over the allocation: one ``srun`` step per node (``launch.py node``), each running
    ``ray start --block`` with the node's own address and resources."""

    def __init__(
        self,
        alloc: Allocation,
        ray: str,
        port_base: int | None,
        stopping: Stopping,
        head: str | None = None,
    ) -> None:
        self.alloc = alloc
        self.stopping = stopping
        self.ray = ray
        self.ports = alloc.ports(port_base)
        self.temp = f"/tmp/gc-ray-{alloc.job}"  # + the node's name; socket paths must stay short
        self.head = head or alloc.head
        self.address = f"{self.head}:{self.ports['port']}"
        self.steps: list[subprocess.Popen] = []
        self.servers: list[subprocess.Popen] = []  # the judge's ``groundcover serve``

    def node_flags(self) -> list[str]:
        own = ("port", "judge-port")  # the head's GCS port; the judge's proxy (not Ray's)
        fixed = [f"--{name}={port}" for name, port in self.ports.items() if name not in own]
        return [*fixed, "--disable-usage-stats", "--block"]

    def node_step(self, nodes: list[str], role: str) -> list[str]:
        return [
            *srun_step(nodes, self.alloc.step_cpus, self.alloc.step_gpus),
            sys.executable,
            str(Path(__file__).resolve()),
            "node",
            role,
            self.address,
            self.temp,
            self.ray,
            *self.node_flags(),
        ]

    def start(self) -> None:
        self.steps.append(
            subprocess.Popen(self.node_step([self.alloc.head], "head"), start_new_session=True)
        )
        others = self.alloc.nodes[1:]
        if others:
            self.wait_for(1)
            self.steps.append(
                subprocess.Popen(self.node_step(others, "worker"), start_new_session=True)
            )
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
                raise SystemExit(128 + self.stopping.signal)
            if any(step.poll() is not None for step in self.steps):
                raise SystemExit("launch: a Ray node stopped while the cluster was starting")
            with contextlib.suppress(subprocess.SubprocessError):
                if self.alive_nodes() >= nodes:
                    say(f"Ray cluster at {self.address}: {nodes} node(s) joined")
                    return
            time.sleep(2)
        raise SystemExit(f"launch: {nodes} Ray node(s) not up after {timeout:.0f} s")

    def stop(self) -> None:
        """Each node's Ray stopped by ending its step: ``srun`` passes the SIGTERM on to
        ``launch.py node``, which stops its ``ray start --block`` and ends what Ray left on
        its node (never ``ray stop``, which stops every Ray on a node, another job's too). A
        step still there after ``STEP_GRACE`` * 3 seconds is killed, and Slurm ends its tasks
        (all within Slurm's KillWait, 30 s by default, after which Slurm kills the launcher)."""
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
        deadline = time.monotonic() + 3 * STEP_GRACE
        for step in self.steps:
            try:
                step.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(step.pid, signal.SIGKILL)
                step.wait(10)


def node_main(argv: list[str]) -> int:
    """``launch.py node head|worker HEAD:PORT TEMP RAY FLAGS...``: one node's Ray, run by its
    ``srun`` step. The node's address is the one it reaches the head from (the head's own:
    the given one), its CPUs and GPUs what Slurm gave this node; Ray runs until the step is
    signalled, then whatever it left on this node is ended (a driver actor outlives its
    raylet for a while and, reparented, escapes Slurm's process tracking)."""
    role, address, temp, ray, *flags = argv
    host, port = address.rsplit(":", 1)
    ip = host if role == "head" else route_source(host, int(port))
    env = dict(os.environ)
    cpus = int(env.get("SLURM_CPUS_ON_NODE") or len(os.sched_getaffinity(0)))
    gpus = gpus_on_node(env)
    temp = f"{temp}-{socket.gethostname().split('.')[0][:16]}"
    place = ["--head", f"--port={port}", "--include-dashboard=false"]
    command = [
        ray,
        "start",
        *(place if role == "head" else [f"--address={address}"]),
        f"--node-ip-address={ip}",
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--temp-dir={temp}",
        *flags,
    ]
    say(f"node {socket.gethostname()}: {role} at {ip}, {cpus} CPUs, {gpus} GPUs")
    child = subprocess.Popen(command, start_new_session=True)
    asked: list[int] = []

    def stop(signum: int, frame: object) -> None:
        asked.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    while True:
        try:
            code = child.wait(1)
            break
        except subprocess.TimeoutExpired:
            if asked and not _waits_for(child, STEP_GRACE):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
    reaped = reap(temp)
    if reaped:
        say(f"ended {reaped} Ray process(es) left on {socket.gethostname()}")
    return 0 if asked else code


def _waits_for(child: subprocess.Popen, seconds: float) -> bool:
    try:
        child.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


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


def srun_step(nodes: list[str], cpus: int, gpus: str | None = None) -> list[str]:
    """One task on each of ``nodes``, sharing the allocation with the other steps, with the
    CPUs (and GPUs) it may use there: since Slurm 22.05 a step no longer inherits the job's
    ``--cpus-per-task``, and with CPU binding it would get one core."""
    return [
        "srun",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        *([f"--gpus-per-node={gpus}"] if gpus else []),
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
    if args.judge:  # Serve with the judge's proxy, before the NLI app can start it without
        start_serve(args, cluster)
    nli_gpus = 0
    if args.nli:
        nli_gpus = deploy_nli(args, alloc, cluster)
        command += ["--nli-app", args.nli_app]
    if args.judge:
        per_replica = args.gpus_per_replica or 1
        count = replicas_for(args.replicas or "auto", alloc, nli_gpus, per_replica)
        command += serve_judge(args, count, cluster)
    return command


def start_serve(args: argparse.Namespace, cluster: Cluster) -> None:
    """Serve on the cluster with its HTTP proxy on the judge's port, on every address of the
    head and of each node holding a replica, asking for the job's key (the nodes' Ray got it
    in their environment). Whoever starts Serve sets its proxy once for all apps."""
    serve = [
        args.serve,
        "start",
        f"--address={cluster.address}",
        "--http-host=0.0.0.0",
        f"--http-port={cluster.ports['judge-port']}",
        "--proxy-location=EveryNode",
    ]
    if subprocess.run(serve, timeout=600).returncode != 0:
        raise SystemExit("launch: Ray Serve could not be started (above)")


def serve_judge(args: argparse.Namespace, replicas: int, cluster: Cluster) -> list[str]:
    """The judge's replicas behind one URL, served (and waited for) before the command; the
    arguments that point the command at it: the head's proxy, which every node reaches and
    which routes to the replicas on every node. Stopped with the cluster."""
    port = cluster.ports["judge-port"]
    serve = [
        *[args.groundcover, "serve", args.judge, "--replicas", str(replicas)],
        *["--ray-address", cluster.address, "--host", "0.0.0.0", "--port", str(port)],
        *["--api-key-env", KEY_ENV],
        *(["--tensor-parallel-size", str(args.gpus_per_replica)] if args.gpus_per_replica else []),
        *[f"--engine-arg={flag}" for flag in args.judge_engine_arg],
    ]
    cluster.servers.append(subprocess.Popen(serve, start_new_session=True))
    asked = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models",
        headers={"Authorization": f"Bearer {os.environ[KEY_ENV]}"},
    )
    deadline = time.monotonic() + 3600  # a large model's first load
    while time.monotonic() < deadline:
        if cluster.stopping.signal is not None:
            raise SystemExit(128 + cluster.stopping.signal)
        if cluster.servers[-1].poll() is not None:
            raise SystemExit("launch: the judge's server stopped while starting (above)")
        with contextlib.suppress(OSError, ValueError, LookupError):
            with urllib.request.urlopen(asked, timeout=5) as answer:  # 404 until the app is up
                served = json.loads(answer.read())["data"][0]["id"]  # a preset's name
            url = f"http://{cluster.head}:{port}/v1"
            say(f"the judge {args.judge}: {replicas} replica(s) of {served} at {url}")
            named = ["--endpoint", url, "--model", served, "--api-key-env", KEY_ENV]
            return named + judge_revision(args.judge)
        time.sleep(5)
    raise SystemExit("launch: the judge's server did not answer within an hour")


# what the judge's weights are, by content (a directory's digest, a hub id's commit), as the
# run would find them had it started the model itself
REVISION_OF = """
import sys
from groundcover.serving.content import model_content
from groundcover.serving.launch.registry import model_source, resolve
print(model_content(model_source(resolve(sys.argv[1])))["revision"] or "")
"""


def judge_revision(model: str) -> list[str]:
    """``--model-revision`` for the served judge: Ray Serve's model list names no weights, so
    without it the run would know the judge by its URL, which changes with the job's ports (a
    requeued or resubmitted job could then not continue its run)."""
    done = subprocess.run(
        [sys.executable, "-c", REVISION_OF, model], capture_output=True, text=True, timeout=3600
    )
    revision = done.stdout.strip()
    if done.returncode != 0 or not revision:
        say(f"no revision found for {model}: the run knows the judge by its URL")
        return []
    return ["--model-revision", revision]


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
    # ~/.ray/auth_token (made here if missing), so every node needs the same home (or
    # RAY_AUTH_TOKEN set in the job's environment)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token":  # a site that turned it off gets no token file
        ensure_ray_token(args.ray)
    if args.judge:  # in the environment of every node's Ray (srun passes it): its proxies ask
        os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
        os.environ[CALLBACK_ENV] = CALLBACK
    alloc = Allocation(dict(os.environ))
    port_base = int(os.environ["GC_RAY_PORT_BASE"]) if os.environ.get("GC_RAY_PORT_BASE") else None
    stopping = Stopping()
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    each = f"{alloc.step_cpus} CPUs, {alloc.step_gpus or alloc.gpus} GPUs each"
    say(f"job {alloc.job}: {len(alloc.nodes)} node(s) {','.join(alloc.nodes)}, {each}")
    cluster = Cluster(alloc, args.ray, port_base, stopping, head_address(alloc, dict(os.environ)))
    code = 128 + signal.SIGTERM
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
        if stopping.signal == signal.SIGUSR1 and code != 0 and args.requeue:
            requeue(alloc)


def ensure_ray_token(ray: str) -> None:
    """Ray's token, made where none is found (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``): ``ray start --head`` in token mode refuses to start without one and
    never makes it. Ray's own command makes it (its path rules, its format); the token is never
    printed into the job's log."""
    if ray_token_found():
        return
    done = subprocess.run(
        [ray, "get-auth-token", "--generate"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"launch: no Ray token and none could be made: {done.stderr.strip()}")


DEFAULT_TOKEN = Path.home() / ".ray" / "auth_token"


def ray_token_found() -> bool:
    """Whether Ray will find a token (its rules: the variable, else the file the path variable
    names, else ``~/.ray/auth_token``), seen without starting a Python that imports Ray (about
    two CPU-seconds each)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(named).expanduser().is_file() if named else DEFAULT_TOKEN.is_file()


def requeue(alloc: Allocation) -> None:
    """The time limit is near and the run is not done: the job goes back into the queue and
    continues where it stopped (the same script, the same --run-dir). Last: Slurm ends this
    job as soon as it is requeued. Needs ``#SBATCH --requeue`` where the site's default is
    not to requeue."""
    say(f"requeueing job {alloc.requeue_id}: it continues where it stopped")
    done = subprocess.run(
        ["scontrol", "requeue", alloc.requeue_id], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        say(f"scontrol requeue failed: {done.stderr.strip()}; submit the script again")


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
    parser.add_argument(
        "--gpus-per-replica",
        type=int,
        help="with --judge: GPUs per replica, its tensor parallelism (default: the preset's)",
    )
    parser.add_argument(
        "--judge-engine-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="with --judge: a vLLM engine flag for its replicas, one token each "
        "(--judge-engine-arg=--max-num-seqs --judge-engine-arg=64)",
    )
    parser.add_argument("--nli", help="an NLI cross-encoder to deploy as a Ray Serve app")
    parser.add_argument("--nli-app", default="groundcover-nli")
    parser.add_argument("--nli-replicas", default="auto")
    parser.add_argument("--ray", default=str(bindir / "ray"), help="the ray command")
    parser.add_argument("--groundcover", default=str(bindir / "groundcover"))
    parser.add_argument("--serve", default=str(bindir / "serve"), help="Ray Serve's command")
    parser.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        default=os.environ.get("GC_REQUEUE", "1") != "0",
        help="at the time limit's warning, stop without requeueing the job",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    if sys.argv[1:2] == ["node"]:  # one node's Ray, run by its srun step
        sys.exit(node_main(sys.argv[2:]))
    sys.exit(main())
