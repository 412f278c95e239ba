"""One groundcover command on a Slurm allocation: a Ray cluster over its nodes, the judge sized
by its model, the command spread over the nodes, and everything stopped however the job ends.

``groundcover.sbatch`` calls this on the allocation's first node (the batch step)::

    launch.py [--drivers-per-node K] [--judge MODEL --replicas auto|N --gpus-per-replica G
              --lora NAME=PATH --judge-start-timeout S] [--nli CHECKPOINT --nli-replicas auto|N]
              [--max-requeues 3] [--no-requeue] [--dashboard]
              -- groundcover eval ... --run-dir runs/x

and the same arguments plan a job before it is submitted, or fetch what it needs::

    launch.py --dry-run [--json] --allocation gpu01:4,gpu02:4 --judge gpt-oss-120b ... -- CMD
    launch.py --prefetch --judge gpt-oss-120b --nli CHECKPOINT -- CMD   # login node
    launch.py --check-offline --judge gpt-oss-120b ... -- CMD           # compute node

1. **The plan** (``Plan``), printed first in the job's log: each node's GPUs, the judge's
   tensor parallelism (the preset's unless ``--gpus-per-replica``), the NLI replicas (one per
   node, pinned by a resource only those nodes offer), the judge's replicas node by node (each
   replica's GPUs on one node: ⌊(node's GPUs - its NLI GPU) / parallelism⌋), the drivers, the
   port block, the waits and the requeue bound. A model that fits no node is refused here.
2. **Before Ray**: with ``HF_HUB_OFFLINE=1`` the offline check names anything not fetched; the
   judge's weights are identified by content or revision (the run's identity: never the
   head's URL, which a requeue moves).
3. **The port block** (from the job id) is checked on every node; a clash moves the job to the
   block half the ring away, once.
4. **Ray over the allocation**: one ``srun`` step per node (``launch.py node``) runs ``ray start
   --block`` with the node's own address (``GC_HEAD_INTERFACE``'s, else the one it reaches the
   head from), CPUs and GPUs, and Ray's files in ``/tmp/gc-ray-JOB-NODE``; at its end it ends
   what Ray left, copies Ray's, Serve's and vLLM's logs (size-capped) into the run directory's
   ``cluster-logs/NODE/`` and removes the folder.
5. **Serve** with its HTTP proxy on the judge's port, then the NLI app (``groundcover serve
   --nli``), then the judge (``groundcover serve MODEL --replicas R --tensor-parallel-size T
   --timeout S``); the command gets ``--endpoint http://HEAD:PORT/v1 --model ... --model-revision
   ...`` (and ``--adapter-prefix`` with ``--lora``), ``--nli-app``, ``--ray-address`` and
   ``--drivers N``.
6. **The end** -- the command done, ``scancel``, the time limit's warning (SIGUSR1, ``#SBATCH
   --signal=B:USR1@300``, acted on during any wait as well) or Ctrl-C: the command is asked to
   stop (the run stays resumable), the judge and each node's step are ended, all within
   ``SHUTDOWN`` seconds (Slurm's KillWait is 30 by default). After the warning the job is
   requeued, at most ``--max-requeues`` times (``SLURM_RESTART_COUNT``); past that it ends
   FAILED with a line saying so.

With ``GC_GRID`` set to a file of argument lines (a paper grid: one run per line), an array
task runs line ``SLURM_ARRAY_TASK_ID`` of it after the command given here.

The standard library only, and the commands ``ray``, ``serve``, ``groundcover``, ``srun`` and
``scontrol``; groundcover's model registry is read for a preset's parallelism (a light import),
the judge's identity and the offline check run as child processes of the checkout's Python.
"""

from __future__ import annotations

import argparse
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# The whole shutdown fits Slurm's default KillWait (30 s, after which it kills every step):
# the command GRACE seconds, then the judge's server and every node's step together, each node
# STEP_GRACE for its Ray and a few seconds for the logs (STEPS_WAIT in all).
GRACE = 12.0
STEP_GRACE = 5.0
STEPS_WAIT = 12.0
SHUTDOWN = GRACE + STEPS_WAIT  # 24 s
# the judge's proxy asks for a key made for the job; the names are serving.cluster.serve_app's
# (this script imports nothing of ours at its start: a test holds the two equal)
KEY_ENV = "GROUNDCOVER_SERVE_API_KEY"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "groundcover.serving.cluster.serve_app:proxy_middlewares"
# Settings docs/clusters.md says every node's Ray needs, set for every step the job starts: a
# loaded node starts Serve's proxy in more than Ray's default 5 s
CLUSTER_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
NLI_RESOURCE = "groundcover_nli"  # offered by the nodes planned to hold an NLI replica, one each
JUDGE_START_TIMEOUT = 3600.0  # a large model's first load from a network filesystem
MAX_REQUEUES = 3
LOG_FILE_CAP = 4 * 2**20  # the last 4 MiB of each log file
LOG_NODE_CAP = 64 * 2**20  # at most 64 MiB of logs per node


class Interrupted(Exception):
    """A stop signal came while the launcher waited for something to start."""

    def __init__(self, signum: int, during: str):
        super().__init__(during)
        self.signum, self.during = signum, during


# ---- what Slurm gave ---------------------------------------------------------------------------


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
        self.restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
        per_node = gpus_per_node(env)
        self.node_gpus = {name: self.gpus if per_node is None else per_node for name in self.nodes}

    @property
    def head(self) -> str:
        return self.nodes[0]


def fewest_cpus(env: dict[str, str]) -> int | None:
    """The fewest CPUs the job has on any node: SLURM_JOB_CPUS_PER_NODE reads ``16(x2),8``."""
    counts = [
        int(part.split("(")[0])
        for part in env.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")
        if part.split("(")[0].isdigit()
    ]
    return min(counts) if counts else None


def gpus_on_node(env: dict[str, str]) -> int:
    """GPUs Slurm gave this node: SLURM_GPUS_ON_NODE, else the visible devices."""
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def gpus_per_node(env: dict[str, str]) -> int | None:
    """The GPUs the job has on each node where it asked for them by node: ``--gpus-per-node``
    (``4`` or ``h100:4``) or a per-node TRES (``gres/gpu:4``, ``gres/gpu:h100:4``); None
    otherwise (then every node is taken to have what this one has)."""
    for name in ("SLURM_GPUS_PER_NODE", "SLURM_TRES_PER_NODE"):
        for part in env.get(name, "").split(","):
            if name == "SLURM_TRES_PER_NODE" and "gpu" not in part:
                continue
            count = part.rsplit(":", 1)[-1]
            if count.isdigit():
                return int(count)
    return None


def parse_allocation(text: str) -> dict[str, int]:
    """``--allocation gpu01:4,gpu02:4`` (a node without ``:N`` has no GPU); ``2x4`` is two
    nodes of four GPUs each."""
    nodes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "x" in part and part.replace("x", "", 1).isdigit():
            count, gpus = part.split("x")
            for _ in range(int(count)):
                nodes[f"node{len(nodes) + 1}"] = int(gpus)
            continue
        name, _, gpus = part.partition(":")
        if not name or (gpus and not gpus.isdigit()) or name in nodes:
            raise SystemExit(f"launch: --allocation {text!r}: {part!r} is not NODE:GPUS")
        nodes[name] = int(gpus or 0)
    if not nodes:
        raise SystemExit(f"launch: --allocation {text!r}: no node")
    return nodes


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


# ---- the plan ----------------------------------------------------------------------------------


def preset_parallelism(model: str) -> tuple[str, int | None]:
    """The served name and tensor parallelism groundcover's registry gives ``model`` (None: not
    a preset, or the registry cannot be imported here)."""
    try:
        from groundcover.serving.launch.registry import PRESETS, resolve
    except ImportError:
        return Path(model).name or model, None
    try:
        preset = resolve(model)
    except Exception:  # an unknown name: `groundcover serve` says so in its own words
        return Path(model).name or model, None
    known = preset.name in PRESETS
    return preset.name, preset.tensor_parallel_size if known else None


@dataclass
class NodePlan:
    name: str
    gpus: int
    nli_replicas: int = 0
    nli_gpus: int = 0
    judge_replicas: int = 0
    drivers: int = 0


@dataclass
class Plan:
    """What the job will do, worked out before anything starts."""

    job: str
    nodes: list[NodePlan]
    drivers_per_node: int
    ports: dict[str, int]
    judge: str | None = None
    served_name: str | None = None
    tensor_parallel: int | None = None
    tensor_parallel_from: str | None = None  # preset | flag (--gpus-per-replica) | default
    replicas: int = 0
    judge_device: str | None = None
    judge_start_timeout: float = JUDGE_START_TIMEOUT
    loras: dict[str, str] = field(default_factory=dict)
    nli: str | None = None
    nli_device: str | None = None
    max_requeues: int = MAX_REQUEUES
    restarts: int = 0
    requeue: bool = True
    dashboard: bool = False

    @property
    def drivers(self) -> int:
        return sum(n.drivers for n in self.nodes)

    @property
    def nli_replicas(self) -> int:
        return sum(n.nli_replicas for n in self.nodes)

    def nli_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.nli_replicas]

    def as_json(self) -> dict[str, object]:
        """The plan as one object (``--dry-run --json``)."""
        return {
            "job": self.job,
            "nodes": [asdict(n) for n in self.nodes],
            "gpus_per_node": {n.name: n.gpus for n in self.nodes},
            "judge": self.judge,
            "served_name": self.served_name,
            "tensor_parallel": self.tensor_parallel,
            "tensor_parallel_from": self.tensor_parallel_from,
            "replicas": self.replicas,
            "replicas_per_node": {n.name: n.judge_replicas for n in self.nodes},
            "bundles_per_replica": self.bundles(),
            "placement_strategy": "STRICT_PACK" if self.judge else None,
            "judge_device": self.judge_device,
            "judge_start_timeout": self.judge_start_timeout,
            "loras": self.loras,
            "nli": self.nli,
            "nli_device": self.nli_device,
            "nli_replicas": self.nli_replicas,
            "nli_replicas_per_node": {n.name: n.nli_replicas for n in self.nodes},
            "drivers": self.drivers,
            "drivers_per_node": {n.name: n.drivers for n in self.nodes},
            "ports": self.ports,
            "port_block": [self.ports["port"], self.ports["max-worker-port"]],
            "max_requeues": self.max_requeues if self.requeue else 0,
            "restarts": self.restarts,
            "dashboard": self.dashboard,
        }

    def bundles(self) -> list[dict[str, int]]:
        """Each judge replica's placement bundles, as serving.cluster.serve_app makes them."""
        if not self.judge:
            return []
        if self.judge_device == "cpu":
            return [{"CPU": 1}]
        return [{"GPU": 1, "CPU": 1}] * (self.tensor_parallel or 1)

    def lines(self) -> list[str]:
        """The plan as the job's log opens with it."""
        gpus = ", ".join(f"{n.name} {n.gpus}" for n in self.nodes)
        out = [f"plan for job {self.job}: {len(self.nodes)} node(s); GPUs: {gpus}"]
        if self.judge:
            where = ", ".join(f"{n.name} {n.judge_replicas}" for n in self.nodes)
            out.append(
                f"plan: judge {self.judge} ({self.served_name}) on {self.judge_device}: "
                f"{self.replicas} replica(s) of tensor parallelism {self.tensor_parallel} "
                f"({self.tensor_parallel_from}), each on one node (STRICT_PACK); per node: {where}"
            )
            out.append(f"plan: the judge's start waits up to {self.judge_start_timeout:.0f} s")
            if self.loras:
                out.append(f"plan: adapters {', '.join(self.loras)} on every judge replica")
        if self.nli:
            where = ", ".join(f"{n.name} {n.nli_replicas}" for n in self.nodes)
            out.append(f"plan: NLI app {self.nli} on {self.nli_device}, per node: {where}")
        drivers = ", ".join(f"{n.name} {n.drivers}" for n in self.nodes)
        out.append(f"plan: {self.drivers} driver(s), per node: {drivers}")
        first, last = self.ports["port"], self.ports["max-worker-port"]
        out.append(
            f"plan: ports {first}-{last} (GCS {first}, judge {self.ports['judge-port']}, "
            f"dashboard {self.ports['dashboard-port'] if self.dashboard else 'off'})"
        )
        bound = (
            f"requeued at the time limit's warning, at most {self.max_requeues} time(s) "
            f"({self.restarts} so far)"
            if self.requeue
            else "not requeued (--no-requeue)"
        )
        out.append(f"plan: {bound}")
        return out


def plan_for(args: argparse.Namespace, job: str, node_gpus: dict[str, int], restarts: int) -> Plan:
    """The plan for this allocation, or a one-line refusal (SystemExit) for one that cannot
    run: a judge that fits no node, more replicas or NLI replicas than fit."""
    nodes = [NodePlan(name, gpus) for name, gpus in node_gpus.items()]
    on_gpu = any(n.gpus for n in nodes)
    plan = Plan(
        job=job,
        nodes=nodes,
        drivers_per_node=args.drivers_per_node,
        ports=block_ports(first_block_start(job, args.port_base)),
        max_requeues=args.max_requeues,
        restarts=restarts,
        requeue=args.requeue,
        dashboard=args.dashboard,
        judge_start_timeout=args.judge_start_timeout,
        loras=dict(parse_lora(text) for text in args.lora),
    )
    for node in nodes:
        node.drivers = args.drivers_per_node
    if args.nli:
        place_nli(plan, args.nli, args.nli_replicas, on_gpu)
    if args.judge:
        place_judge(plan, args, on_gpu)
    elif plan.loras:
        raise SystemExit("launch: --lora is for the judge's replicas: give --judge")
    return plan


def place_nli(plan: Plan, model: str, asked: str, on_gpu: bool) -> None:
    """One NLI replica per node (on CUDA: one GPU of that node), on the first N nodes; on a
    CPU-only allocation one replica."""
    plan.nli, plan.nli_device = model, "cuda" if on_gpu else "cpu"
    count = (len(plan.nodes) if on_gpu else 1) if asked == "auto" else int(asked)
    if count < 1:
        raise SystemExit("launch: --nli-replicas must be at least 1 (or leave --nli out)")
    if count > len(plan.nodes):
        raise SystemExit(
            f"launch: --nli-replicas {count}: one NLI replica per node, and the job has "
            f"{len(plan.nodes)} node(s)"
        )
    for node in plan.nodes[:count]:
        node.nli_replicas = 1
        node.nli_gpus = 1 if on_gpu else 0
        if on_gpu and node.gpus < 1:
            raise SystemExit(f"launch: node {node.name} has no GPU for its NLI replica")


def place_judge(plan: Plan, args: argparse.Namespace, on_gpu: bool) -> None:
    served, preset_tp = preset_parallelism(args.judge)
    plan.judge, plan.served_name = args.judge, served
    if args.gpus_per_replica:
        plan.tensor_parallel, plan.tensor_parallel_from = args.gpus_per_replica, "flag"
    elif preset_tp:
        plan.tensor_parallel, plan.tensor_parallel_from = preset_tp, "preset"
    else:
        plan.tensor_parallel, plan.tensor_parallel_from = 1, "default"
    tp = plan.tensor_parallel
    asked = args.replicas or "auto"
    if not on_gpu:  # vLLM's CPU engine: one replica where asked, on the first nodes
        plan.judge_device, plan.tensor_parallel = "cpu", 1
        if asked == "auto":
            raise SystemExit(
                "launch: --replicas auto counts GPUs and the allocation has none: give "
                "--replicas N for CPU replicas, or ask for GPUs (--gpus-per-node)"
            )
        plan.replicas = int(asked)
        for k in range(plan.replicas):
            plan.nodes[k % len(plan.nodes)].judge_replicas += 1
        return
    plan.judge_device = "cuda"
    free = {n.name: n.gpus - n.nli_gpus for n in plan.nodes}
    fits = {name: max(gpus, 0) // tp for name, gpus in free.items()}
    if not any(fits.values()):
        most = max(plan.nodes, key=lambda n: n.gpus - n.nli_gpus)
        beside = f" ({most.nli_gpus} of its {most.gpus} for the NLI app)" if most.nli_gpus else ""
        raise SystemExit(
            f"launch: {served} needs {tp} GPUs on one node (tensor parallelism {tp}, "
            f"{plan.tensor_parallel_from}) and no node has that many free: the most is "
            f"{free[most.name]} on {most.name}{beside}; ask for nodes with {tp}+ GPUs, fewer "
            "NLI replicas, or a smaller --gpus-per-replica"
        )
    room = sum(fits.values())
    count = room if asked == "auto" else int(asked)
    if count < 1 or count > room:
        per = ", ".join(f"{name} {n}" for name, n in fits.items())
        raise SystemExit(
            f"launch: --replicas {count}: {room} replica(s) of {tp} GPU(s) fit this allocation "
            f"(per node: {per}); a replica that fits nowhere would wait forever"
        )
    left = count
    for node in plan.nodes:  # in node order: Ray places them where they fit, as many per node
        node.judge_replicas = min(fits[node.name], left)
        left -= node.judge_replicas
    plan.replicas = count


def parse_lora(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"launch: --lora {text!r}: want NAME=PATH")
    return name, path


# ---- ports -------------------------------------------------------------------------------------

PORT_FLOOR, PORT_CEILING = 10000, 32768  # Linux's ephemeral range starts at 32768
PORT_BLOCK = 400
BLOCKS = (PORT_CEILING - PORT_FLOOR) // PORT_BLOCK  # 56


def first_block_start(job: str, base: int | None = None) -> int:
    """Where the job's block of ports starts: ``GC_RAY_PORT_BASE``, else the job id's block
    among the 56 between PORT_FLOOR and PORT_CEILING. Jobs whose ids differ by less than 56
    (neighbours, the tasks of one array: each has its own id) never share one."""
    if base is not None:
        return base
    return PORT_FLOOR + int(job) % BLOCKS * PORT_BLOCK


def other_block(start: int) -> int:
    """The block a clash moves the job to: half the ring away, past the neighbouring jobs'."""
    index = (start - PORT_FLOOR) // PORT_BLOCK
    return PORT_FLOOR + (index + BLOCKS // 2) % BLOCKS * PORT_BLOCK


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


def taken_here(first: int, last: int) -> list[int]:
    return [port for port in range(first, last + 1) if port_taken(port)]


def ports_main(argv: list[str]) -> int:
    """``launch.py ports FIRST LAST``, one srun task per node: the ports of the range in use
    there, a line ``NODE PORT`` each."""
    first, last = int(argv[0]), int(argv[1])
    node = socket.gethostname().split(".")[0]
    for port in taken_here(first, last):
        print(f"{node} {port}", flush=True)
    return 0


# ---- addresses ---------------------------------------------------------------------------------


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
    raise SystemExit(f"launch: GC_HEAD_INTERFACE={name}: no address on {name} on this node")


def interface_addresses() -> list[str]:
    """Every IPv4 address of this node's interfaces, loopback left out."""
    found = []
    for _, name in socket.if_nameindex():
        with contextlib.suppress(SystemExit):
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
    raise SystemExit(
        f"launch: {socket.gethostname()} resolves only to {names}{pick}: export "
        "GC_HEAD_INTERFACE=<the interface the nodes share, e.g. ib0> before sbatch"
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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


# ---- waiting, with the time limit in mind ------------------------------------------------------


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
            raise SystemExit(f"launch: {what} took more than {timeout:.0f} s")


def end_group(child: subprocess.Popen, grace: float = STEP_GRACE) -> None:
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


# ---- Ray over the allocation -------------------------------------------------------------------


class Cluster:
    """Ray over the allocation: one ``srun`` step per node (``launch.py node``), each running
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
        self.steps: list[subprocess.Popen] = []
        self.servers: list[subprocess.Popen] = []  # the judge's ``groundcover serve``

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
            raise SystemExit(f"launch: GC_RAY_PORT_BASE's block has ports in use: {held}")
        moved = block_ports(other_block(self.ports["port"]))
        say(
            f"ports in use: {held}; moving the job to ports {moved['port']}-"
            f"{moved['max-worker-port']}"
        )
        again = self.taken(moved["port"], moved["max-worker-port"])
        if again:
            held = ", ".join(f"{port} on {node}" for node, port in again[:5])
            raise SystemExit(
                f"launch: ports in use in both blocks tried ({held}): set GC_RAY_PORT_BASE to a "
                f"free block of {PORT_BLOCK} between {PORT_FLOOR} and {PORT_CEILING}"
            )
        self.plan.ports = moved

    def taken(self, first: int, last: int) -> list[tuple[str, int]]:
        """The ports of the range in use on any node of the job: one srun task per node."""
        nodes = self.alloc.nodes
        ask = [*srun_step(nodes, 1), sys.executable, str(Path(__file__).resolve()), "ports"]
        try:
            done = subprocess.run(
                [*ask, str(first), str(last)], capture_output=True, text=True, timeout=120
            )
            lines = done.stdout.split("\n") if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            lines = None
        if lines is None:  # no srun (run by hand): this node only
            host = socket.gethostname().split(".")[0]
            return [(host, port) for port in taken_here(first, last)]
        found = [line.split() for line in lines if len(line.split()) == 2]
        return [(node, int(port)) for node, port in found if port.isdigit()]

    def node_flags(self) -> list[str]:
        own = ("port", "judge-port")  # the head's GCS port; the judge's proxy (not Ray's)
        fixed = [f"--{name}={port}" for name, port in self.ports.items() if name not in own]
        return [*fixed, "--disable-usage-stats", "--block"]

    def node_step(self, nodes: list[str], role: str) -> list[str]:
        settings = {
            "role": role,
            "address": self.address,
            "temp": self.temp,
            "ray": self.ray,
            "flags": self.node_flags(),
            "nli_nodes": self.plan.nli_nodes(),
            "dashboard": self.plan.dashboard,
            "logs": str(self.logs) if self.logs else None,
            "stop_file": str(self.stop_file) if self.stop_file else None,
        }
        return [
            *srun_step(nodes, self.alloc.step_cpus, self.alloc.step_gpus),
            sys.executable,
            str(Path(__file__).resolve()),
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
                raise Interrupted(self.stopping.signal, "the Ray nodes to join")
            if any(step.poll() is not None for step in self.steps):
                raise SystemExit("launch: a Ray node stopped while the cluster was starting")
            with contextlib.suppress(subprocess.SubprocessError):
                if self.alive_nodes() >= nodes:
                    say(f"Ray cluster at {self.address}: {nodes} node(s) joined")
                    return
            time.sleep(2)
        raise SystemExit(f"launch: {nodes} Ray node(s) not up after {timeout:.0f} s")

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
                asked.parent.mkdir(parents=True, exist_ok=True)
                asked.touch()
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
    """``launch.py node SETTINGS``: one node's Ray, run by its ``srun`` step. The node's
    address is the one it reaches the head from (the head's own: the given one; with
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
    cpus = int(env.get("SLURM_CPUS_ON_NODE") or len(os.sched_getaffinity(0)))
    gpus = gpus_on_node(env)
    node = socket.gethostname().split(".")[0]
    temp = f"{settings['temp']}-{node[:16]}"
    dashboard = ["--include-dashboard=true", "--dashboard-host=0.0.0.0"]
    place = ["--head", f"--port={port}", *(dashboard if settings["dashboard"] else [])]
    if role == "head" and not settings["dashboard"]:
        place.append("--include-dashboard=false")
    own = {NLI_RESOURCE: 1} if node in settings["nli_nodes"] else {}
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
    say(f"node {socket.gethostname()}: {role} at {ip}, {cpus} CPUs, {gpus} GPUs")
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
        say(f"ended {reaped} Ray process(es) left on {socket.gethostname()}")
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
    into.mkdir(parents=True, exist_ok=True)
    budget, copied, index = LOG_NODE_CAP, 0, []
    for path in files:
        size = path.stat().st_size
        keep = min(size, LOG_FILE_CAP, budget)
        relative = path.relative_to(temp)
        if keep <= 0 and size:
            index.append(f"{relative}\t{size}\tleft out (the node's cap)")
            continue
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with path.open("rb") as source, target.open("wb") as sink:
            source.seek(size - keep)
            sink.write(source.read(keep))
        budget -= keep
        copied += 1
        index.append(f"{relative}\t{size}\t" + ("whole" if keep == size else f"last {keep}"))
    (into / "index.txt").write_text("".join(line + "\n" for line in index))
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


def the_command(args: argparse.Namespace, alloc: Allocation) -> list[str]:
    """The command after ``--``, with the array task's grid line."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit("launch: give the groundcover command after --")
    grid = os.environ.get("GC_GRID")
    if grid:
        command += grid_line(Path(grid), alloc.array_task)
    return command


def run_dir_of(command: list[str]) -> Path | None:
    """The command's ``--run-dir`` (the last one given wins, as for the CLI)."""
    found = None
    for k, word in enumerate(command):
        if word == "--run-dir" and k + 1 < len(command):
            found = command[k + 1]
        elif word.startswith("--run-dir="):
            found = word.split("=", 1)[1]
    return Path(found) if found else None


def command_for(
    args: argparse.Namespace, plan: Plan, cluster: Cluster, command: list[str]
) -> list[str]:
    """The command with the cluster, the drivers and the services it uses added; the services
    started (and waited for) on the way."""
    command = [*command, "--ray-address", cluster.address, "--drivers", str(plan.drivers)]
    if plan.judge:  # Serve with the judge's proxy, before the NLI app can start it without
        start_serve(args, cluster)
    if plan.nli:
        deploy_nli(args, plan, cluster)
        command += ["--nli-app", args.nli_app]
    if plan.judge:
        command += serve_judge(args, plan, cluster)
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
    if waited(serve, "Ray Serve's start", 600, cluster.stopping) != 0:
        raise SystemExit("launch: Ray Serve could not be started (above)")


def deploy_nli(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> None:
    """The NLI app on the cluster, one replica on each node the plan names (pinned there by the
    resource only those nodes offer); waited for, giving way to a stop signal."""
    assert plan.nli and plan.nli_device
    resources = {NLI_RESOURCE: 1}
    serve = [
        *[args.groundcover, "serve", "--nli", plan.nli, "--nli-app", args.nli_app],
        *["--nli-replicas", str(plan.nli_replicas), "--nli-device", plan.nli_device],
        *["--nli-resources", json.dumps(resources), "--ray-address", cluster.address],
        *["--timeout", str(int(args.nli_start_timeout))],
    ]
    timeout = args.nli_start_timeout + 120
    if waited(serve, "the NLI app's deploy", timeout, cluster.stopping) != 0:
        raise SystemExit(f"launch: the NLI app {args.nli_app} could not be deployed (above)")


def serve_judge(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> list[str]:
    """The judge's replicas behind one URL, served (and waited for) before the command; the
    arguments that point the command at it: the head's proxy, which every node reaches and
    which routes to the replicas on every node. Stopped with the cluster."""
    assert plan.judge
    port = cluster.ports["judge-port"]
    serve = judge_serve_command(args, plan, cluster)
    ready = ready_file_of(cluster)
    ready.unlink(missing_ok=True)
    cluster.servers.append(subprocess.Popen(serve, start_new_session=True))
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
                raise SystemExit("launch: the judge's server stopped while starting (above)")
            if ready.is_file():
                with contextlib.suppress(OSError, ValueError, LookupError):
                    with urllib.request.urlopen(asked, timeout=5) as answer:
                        served = json.loads(answer.read())["data"][0]["id"]  # a preset's name
                    url = f"http://{host_port(cluster.head, port)}/v1"
                    say(f"the judge {plan.judge}: {plan.replicas} replica(s) of {served} at {url}")
                    return judge_arguments(url, served, plan, args.judge_revision)
            time.sleep(5)
    finally:
        ready.unlink(missing_ok=True)
    raise SystemExit(
        f"launch: the judge's server did not answer within {plan.judge_start_timeout:.0f} s"
    )


def judge_serve_command(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> list[str]:
    """``groundcover serve`` for the plan's judge: its replicas and parallelism, the one start
    timeout, the job's key, the adapters (multiplexed on every replica) and engine flags."""
    assert plan.judge
    return [
        *[args.groundcover, "serve", plan.judge, "--replicas", str(plan.replicas)],
        *["--ray-address", cluster.address, "--host", "0.0.0.0"],
        *["--port", str(cluster.ports["judge-port"]), "--api-key-env", KEY_ENV],
        *["--timeout", str(int(plan.judge_start_timeout))],
        *["--ready-file", str(ready_file_of(cluster))],
        *["--tensor-parallel-size", str(plan.tensor_parallel)],
        *[f"--lora={name}={path}" for name, path in plan.loras.items()],
        *[f"--engine-arg={flag}" for flag in args.judge_engine_arg],
    ]


def ready_file_of(cluster: Cluster) -> Path:
    """Where ``groundcover serve`` says the judge is up: every replica healthy, not only its
    model list (which Serve's ingress answers before any replica has loaded). On the head's
    own /tmp: the server runs beside the launcher."""
    return Path(f"/tmp/gc-judge-ready-{cluster.alloc.job}-{os.getpid()}")


def judge_arguments(url: str, served: str, plan: Plan, revision: str) -> list[str]:
    """What the command gets to ask the judge: the head's proxy, the served name, the key, the
    weights' revision (its identity), and with adapters the prefix that names them
    (``MODEL:ADAPTER``, Serve's multiplexing)."""
    named = ["--endpoint", url, "--model", served, "--api-key-env", KEY_ENV]
    if plan.loras:
        named += ["--adapter-prefix", f"{served}:"]
    return named + ["--model-revision", revision]


# what the judge's weights are, by content (a directory's digest, a hub id's commit), as the
# run would find them had it started the model itself
REVISION_OF = """
import sys
from groundcover.serving.content import model_content
from groundcover.serving.launch.registry import model_source, resolve
from pathlib import Path
found = model_content(model_source(resolve(sys.argv[1])))["revision"]
Path(sys.argv[2]).write_text(found or "")
"""


def judge_revision(model: str, given: str | None, stopping: Stopping) -> str:
    """The judge's weights by content or revision, found before anything starts, where the
    recipe knows their path: Ray Serve's model list names no weights, and the head's URL changes
    with the job's ports and nodes (a requeued or resubmitted job could then not continue its
    run). One that cannot be found stops the job, with what to do."""
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
        raise SystemExit(
            f"launch: no revision found for the judge {model} (its weights not fetched?): "
            "fetch them (launch.py --prefetch), or give --judge-revision"
        )
    say(f"the judge {model} is known by its weights: {revision}")
    return revision


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


def prepare_environment(args: argparse.Namespace) -> None:
    """What every process the launcher starts inherits (srun passes the environment on to each
    node's step): Ray's token mode, the judge's proxy key and callback, the settings every
    node's Ray needs, and gpt-oss's tiktoken files where they were fetched."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token":  # a site that turned it off gets no token file
        ensure_ray_token(args.ray)
    if args.judge:  # in the environment of every node's Ray: its proxies ask for it
        os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(32))
        os.environ[CALLBACK_ENV] = CALLBACK
    for name, value in CLUSTER_ENV.items():
        os.environ.setdefault(name, value)
    encodings = tiktoken_folder()
    if encodings is not None and encodings.is_dir():
        os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(encodings))


def tiktoken_folder() -> Path | None:
    """Where ``--prefetch`` puts gpt-oss's tiktoken files: ``$HF_HOME/tiktoken-encodings``."""
    home = os.environ.get("HF_HOME")
    return Path(home) / "tiktoken-encodings" if home else None


def prefetch_command(args: argparse.Namespace, command: list[str], check: bool) -> list[str]:
    """``scripts/prefetch.py`` for what this job needs: the judge, the NLI checkpoint,
    the adapters and the datasets the command names."""
    script = Path(__file__).resolve().parents[1] / "prefetch.py"
    asked = [sys.executable, str(script), "--check" if check else "--fetch"]
    if args.judge:
        asked += ["--judge", args.judge]
        if args.judge_revision:
            asked += ["--judge-revision", args.judge_revision]
    if args.nli:
        asked += ["--nli", args.nli]
    for text in args.lora:
        asked += ["--lora", text]
    return [*asked, "--", *command]


def run(args: argparse.Namespace) -> int:
    alloc = Allocation(dict(os.environ))
    stopping = Stopping()
    for signum in STOP_SIGNALS:
        signal.signal(signum, stopping)
    command = the_command(args, alloc)
    plan = plan_for(args, alloc.job, alloc.node_gpus, alloc.restarts)
    for line in plan.lines():
        say(line)
    prepare_environment(args)
    each = f"{alloc.step_cpus} CPUs, {alloc.step_gpus or alloc.gpus} GPUs each"
    say(f"job {alloc.job}: {len(alloc.nodes)} node(s) {','.join(alloc.nodes)}, {each}")
    run_dir = run_dir_of(command)
    submitted = Path(os.environ.get("SLURM_SUBMIT_DIR") or ".")
    logs = run_dir / "cluster-logs" if run_dir else submitted / f"cluster-logs-{alloc.job}"
    cluster: Cluster | None = None
    code = 1
    try:
        if os.environ.get("HF_HUB_OFFLINE") == "1":  # before any GPU waits: what is missing
            check = prefetch_command(args, command, check=True)
            if waited(check, "the offline check", 600, stopping) != 0:
                raise SystemExit("launch: this node lacks what the job needs (above)")
        if plan.judge:
            args.judge_revision = judge_revision(plan.judge, args.judge_revision, stopping)
        head = head_address(dict(os.environ), len(alloc.nodes) > 1)
        cluster = Cluster(alloc, plan, args.ray, stopping, head, logs)
        cluster.choose_ports(fixed=args.port_base is not None)
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "plan.json").write_text(json.dumps(plan.as_json(), indent=1) + "\n")
        cluster.start()
        command = command_for(args, plan, cluster, command)
        say("running: " + shlex.join(command))
        stopping.child = subprocess.Popen(command, start_new_session=True)
        if stopping.signal is not None:  # a signal between the start and now
            os.killpg(stopping.child.pid, signal.SIGTERM)
        code = wait(stopping.child, stopping)
        say(f"the command ended with exit code {code}")
    except Interrupted as stop:
        say(f"{signal.Signals(stop.signum).name} while waiting for {stop.during}: stopped waiting")
        code = 128 + stop.signum
    finally:
        if cluster is not None:
            cluster.stop()
            say("Ray stopped on every node")
            if stopping.child is None and sys.exc_info()[0] is SystemExit:
                # Serve's reason often points elsewhere ("see root cause above"): the cause
                # is in a replica's own log, now in the run directory
                for where, line in errors_in_logs(logs):
                    say(f"an error in {where}: {line}")
    if stopping.signal == signal.SIGUSR1 and code != 0 and args.requeue:
        return requeue(alloc, args.max_requeues, code)
    return code


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


def requeue(alloc: Allocation, most: int, code: int) -> int:
    """The time limit is near and the run is not done: the job goes back into the queue and
    continues where it stopped (the same script, the same --run-dir), at most ``most`` times
    (``SLURM_RESTART_COUNT`` says how often it was). Last: Slurm ends this job as soon as it is
    requeued. Needs ``#SBATCH --requeue`` where the site's default is not to requeue."""
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


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bindir = Path(sys.executable).parent
    made.add_argument("--drivers-per-node", type=int, default=1)
    made.add_argument("--judge", help="serve this model once for every driver (Ray Serve LLM)")
    made.add_argument("--replicas", help="with --judge: N replicas, or auto (as many as fit)")
    made.add_argument(
        "--gpus-per-replica",
        type=int,
        help="with --judge: GPUs per replica, its tensor parallelism (default: the preset's)",
    )
    made.add_argument(
        "--judge-engine-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="with --judge: a vLLM engine flag for its replicas, one token each "
        "(--judge-engine-arg=--max-num-seqs --judge-engine-arg=64)",
    )
    made.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="with --judge: a LoRA adapter on every replica (multiplexed); the command gets "
        "--adapter-prefix",
    )
    made.add_argument(
        "--judge-start-timeout",
        type=float,
        default=JUDGE_START_TIMEOUT,
        help="seconds the judge's start may take (passed to `groundcover serve --timeout`)",
    )
    made.add_argument(
        "--judge-revision", help="the judge's weights' revision, when it cannot be found here"
    )
    made.add_argument("--nli", help="an NLI cross-encoder to deploy as a Ray Serve app")
    made.add_argument("--nli-app", default="groundcover-nli")
    made.add_argument("--nli-replicas", default="auto", help="N (one per node), or auto")
    made.add_argument("--nli-start-timeout", type=float, default=1800.0)
    made.add_argument(
        "--max-requeues",
        type=int,
        default=MAX_REQUEUES,
        help="requeues at the time limit's warning before the job ends FAILED",
    )
    made.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        default=os.environ.get("GC_REQUEUE", "1") != "0",
        help="at the time limit's warning, stop without requeueing the job",
    )
    made.add_argument(
        "--dashboard", action="store_true", help="Ray's dashboard on the head (serve status)"
    )
    made.add_argument("--ray", default=str(bindir / "ray"), help="the ray command")
    made.add_argument("--groundcover", default=str(bindir / "groundcover"))
    made.add_argument("--serve", default=str(bindir / "serve"), help="Ray Serve's command")
    made.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    made.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    made.add_argument(
        "--allocation",
        help="NODE:GPUS,... (or NxGPUS) for --dry-run outside a job; default: Slurm's",
    )
    made.add_argument(
        "--prefetch",
        action="store_true",
        help="fetch what the job needs into HF_HOME and GROUNDCOVER_HOME (on a login node)",
    )
    made.add_argument(
        "--check-offline",
        action="store_true",
        help="say what the job needs that this node does not have (HF_HUB_OFFLINE=1)",
    )
    made.add_argument("command", nargs=argparse.REMAINDER)
    return made


def dry_run(args: argparse.Namespace) -> int:
    """The plan for the allocation given (``--allocation``) or this job's, started nothing."""
    alloc_env = dict(os.environ)
    if args.allocation:
        node_gpus = parse_allocation(args.allocation)
        job = alloc_env.get("SLURM_JOB_ID") or "0"
        restarts = int(alloc_env.get("SLURM_RESTART_COUNT") or 0)
    elif alloc_env.get("SLURM_JOB_ID"):
        alloc = Allocation(alloc_env)
        node_gpus, job, restarts = alloc.node_gpus, alloc.job, alloc.restarts
    else:
        raise SystemExit("launch: --dry-run outside a job needs --allocation NODE:GPUS,...")
    plan = plan_for(args, job, node_gpus, restarts)
    if args.json:
        print(json.dumps(plan.as_json(), indent=1))
    else:
        for line in plan.lines():
            print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    base = os.environ.get("GC_RAY_PORT_BASE")
    args.port_base = int(base) if base else None
    if args.dry_run:
        return dry_run(args)
    if args.prefetch or args.check_offline:
        command = list(args.command)
        command = command[1:] if command[:1] == ["--"] else command
        return subprocess.run(prefetch_command(args, command, args.check_offline)).returncode
    return run(args)


if __name__ == "__main__":
    if sys.argv[1:2] == ["node"]:  # one node's Ray, run by its srun step
        sys.exit(node_main(sys.argv[2:]))
    if sys.argv[1:2] == ["ports"]:  # the ports of a block in use on this node
        sys.exit(ports_main(sys.argv[2:]))
    sys.exit(main())
