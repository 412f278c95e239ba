"""What a cluster job will do, worked out before anything starts (``groundcover cluster plan``).

The allocation (each node's GPUs, as Slurm gave them: ``scontrol show job -d``, a heterogeneous
job's components included; or ``--allocation`` in a dry run), the judge's tensor parallelism
(the smallest that holds one replica in the GPUs' memory: ``sizing``; ``--gpus-per-replica``
overrides it), its replicas node by node (each replica's GPUs on one node), the NLI app (one
replica per node, on a GPU of its own or sharing a judge's with ``--nli-gpu-fraction``), the
drivers, the block of ports and the requeue bound; and, node by node, the GPUs that stay idle
and why. What cannot run -- a model that fits no node, more replicas than fit -- is refused
here in one line (``PlanError``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..launch.registry import PRESETS, UnknownModelError, model_source, resolve
from .sizing import GIB, UTILISATION, ModelSize, SizingError, read_config, size_of

JUDGE_START_TIMEOUT = 3600.0  # a large model's first load from a network filesystem
NLI_START_TIMEOUT = 1800.0
MAX_REQUEUES = 3
NLI_APP = "groundcover-nli"
DEFAULT_GPU_GIB = 80.0  # a dry run's GPUs when --gpu-memory is not given (an H100 / A100 80GB)
SHARE_HINT = 0.1  # the --nli-gpu-fraction a plan suggests where a share would fill idle GPUs

PORT_FLOOR, PORT_CEILING = 10000, 32768  # Linux's ephemeral range starts at 32768
PORT_BLOCK = 400
BLOCKS = (PORT_CEILING - PORT_FLOOR) // PORT_BLOCK  # 56


class PlanError(ValueError):
    """A job that cannot run as asked: one line saying why and what to change."""


# ---- what was asked ----------------------------------------------------------------------------


@dataclass
class JudgeAsk:
    model: str
    replicas: str = "auto"
    gpus_per_replica: int | None = None
    max_model_len: int | None = None
    loras: dict[str, str] = field(default_factory=dict)
    start_timeout: float = JUDGE_START_TIMEOUT
    engine_args: list[str] = field(default_factory=list)
    revision: str | None = None


@dataclass
class PlanAsk:
    """The job's options (``groundcover cluster plan | prefetch | check-offline | run``)."""

    judge: JudgeAsk | None = None
    drivers_per_node: int = 1
    nli: str | None = None
    nli_app: str = NLI_APP
    nli_replicas: str = "auto"
    nli_start_timeout: float = NLI_START_TIMEOUT
    nli_gpu_fraction: float | None = None
    max_requeues: int = MAX_REQUEUES
    requeue: bool = True
    dashboard: bool = False
    port_base: int | None = None
    gpu_memory_gib: float | None = None


# ---- the allocation ----------------------------------------------------------------------------


@dataclass
class Component:
    """One component of a heterogeneous job (``index`` K, which ``srun --het-group=K`` names), or
    the whole of a plain job (``index`` None): its nodes, the CPUs a step may use on each and
    its GPUs per node as Slurm says them (``--gpus-per-node``; None where not asked by node)."""

    index: int | None
    nodes: list[str]
    cpus: int
    gpus: str | None = None
    asked_gpus: int | None = None  # by node (--gpus-per-node or a per-node TRES)

    def gpu_count(self, otherwise: int) -> int:
        """Its GPUs on each node where it asked for them by node, else ``otherwise`` (what the
        head reads in the head's own component, none in another)."""
        return self.asked_gpus if self.asked_gpus is not None else otherwise


@dataclass
class Allocation:
    """What Slurm gave this job: its nodes by Slurm's names, each node's GPUs, CPUs per step;
    a heterogeneous job's components (a step reaches a component's nodes only when it names
    the component: ``srun --het-group``)."""

    job: str
    nodes: list[str]
    node_gpus: dict[str, int]
    step_cpus: int = 1
    step_gpus: str | None = None
    array_task: str | None = None
    requeue_id: str = ""
    restarts: int = 0
    gpus_from: str = "Slurm"
    components: list[Component] = field(default_factory=list)

    @property
    def head(self) -> str:
        return self.nodes[0]

    def groups(self, nodes: list[str]) -> list[tuple[Component, list[str]]]:
        """``nodes`` by the component each belongs to, in the components' order: one step each
        (a plain job: one component, every node)."""
        parts = self.components or [Component(None, self.nodes, self.step_cpus, self.step_gpus)]
        found = [(part, [n for n in part.nodes if n in nodes]) for part in parts]
        return [(part, names) for part, names in found if names]

    @classmethod
    def from_slurm(cls, env: dict[str, str], detail: str | None = None) -> Allocation:
        """From the job's environment, each node's GPUs from ``scontrol show job -d`` (``detail``:
        its output, read here when None): per node as Slurm gave them, so ``--gpus=12`` over an
        8-GPU and a 4-GPU node is 8 and 4, not the head's count twice."""
        job = env.get("SLURM_JOB_ID") or str(os.getpid())
        nodes = job_nodes(env)
        if detail is None:
            detail = scontrol_detail(job)
        per_node = gres_per_node(detail) if detail else {}
        by_env = gpus_per_node(env)
        here = gpus_on_node(env)
        components = het_components(env)
        asked = {  # a heterogeneous job's GPUs by node, component by component
            name: part.gpu_count(here if nodes and nodes[0] in part.nodes else 0)
            for part in components
            for name in part.nodes
        }
        gpus: dict[str, int] = {}
        for name in nodes:
            by_node = asked.get(name, by_env)
            if name in per_node:
                gpus[name] = per_node[name]
            else:
                gpus[name] = by_node if by_node is not None else here
        source = "scontrol" if per_node else ("SLURM_GPUS_PER_NODE" if by_env else "this node")
        if components and not per_node:
            source = "each component's request (SLURM_*_HET_GROUP_K)"
        array = env.get("SLURM_ARRAY_JOB_ID")
        task = env.get("SLURM_ARRAY_TASK_ID")
        return cls(
            job=job,
            nodes=nodes,
            node_gpus=gpus,
            step_cpus=step_cpus(env),
            step_gpus=env.get("SLURM_GPUS_PER_NODE"),
            array_task=task,
            requeue_id=f"{array}_{task}" if array and task else job,
            restarts=int(env.get("SLURM_RESTART_COUNT") or 0),
            gpus_from=source,
            components=components,
        )


def step_cpus(env: dict[str, str]) -> int:
    """The CPUs a step may use on each node: the job's ``--cpus-per-task``, else the fewest it
    has on a node, else this node's."""
    here = int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    return int(env.get("SLURM_CPUS_PER_TASK") or fewest_cpus(env) or here)


def component_env(env: dict[str, str], index: int) -> dict[str, str]:
    """Component ``index``'s variables under their plain names: Slurm sets each
    ``SLURM_*_HET_GROUP_K`` for component K (``SLURM_CPUS_PER_TASK_HET_GROUP_1`` ...)."""
    suffix = f"_HET_GROUP_{index}"
    return {name[: -len(suffix)]: value for name, value in env.items() if name.endswith(suffix)}


def het_components(env: dict[str, str]) -> list[Component]:
    """A heterogeneous job's components (``SLURM_HET_SIZE`` of them), each with its nodes,
    CPUs and GPUs per node from its own variables; none for a plain job."""
    size = int(env.get("SLURM_HET_SIZE") or 0)
    found: list[Component] = []
    for index in range(size if size > 1 else 0):
        own = component_env(env, index)
        cpus = own.get("SLURM_CPUS_PER_TASK") or fewest_cpus(own) or step_cpus(env)
        found.append(
            Component(
                index,
                expand_nodes(own.get("SLURM_JOB_NODELIST", "")),
                int(cpus),
                own.get("SLURM_GPUS_PER_NODE"),
                gpus_per_node(own),
            )
        )
    seen: dict[str, int] = {}
    for part in found:  # one node, one Ray: it cannot start with two components' resources
        for name in part.nodes:
            if name in seen:
                raise PlanError(
                    f"node {name} is in components {seen[name]} and {part.index} of this "
                    "heterogeneous job: give each component nodes of its own"
                )
            seen[name] = part.index or 0
    return found


def job_nodes(env: dict[str, str]) -> list[str]:
    """The job's nodes, head first: a heterogeneous job's components in order
    (``SLURM_JOB_NODELIST_HET_GROUP_K``), else ``SLURM_JOB_NODELIST``."""
    size = int(env.get("SLURM_HET_SIZE") or 0)
    if size > 1:
        found: list[str] = []
        for k in range(size):
            for name in expand_nodes(env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}", "")):
                if name not in found:
                    found.append(name)
        if found:
            return found
    return expand_nodes(env.get("SLURM_JOB_NODELIST") or socket.gethostname())


def scontrol_detail(job: str) -> str | None:
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-d", job],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


GRES_LINE = re.compile(r"^\s*Nodes=(\S+)\s.*?\bGRES=(\S*)", re.M)


def gres_per_node(detail: str) -> dict[str, int]:
    """Each node's GPUs from ``scontrol show job -d``: its per-node lines ``Nodes=n1 CPU_IDs=...
    GRES=gpu:h100:8(IDX:0-7)`` (every component of a heterogeneous job has its own)."""
    found: dict[str, int] = {}
    for nodes, gres in GRES_LINE.findall(detail):
        count = sum(gpu_count(part) for part in re.split(r",(?=[a-z])", gres) if part)
        for name in expand_nodes(nodes):
            found[name] = found.get(name, 0) + count
    return found


def gpu_count(gres: str) -> int:
    """``gpu:h100:8(IDX:0-7)`` / ``gpu:4`` / ``gpu:a100:2(S:0)`` -> 8 / 4 / 2; not a GPU -> 0."""
    bare = gres.split("(", 1)[0]
    if not bare.startswith("gpu"):
        return 0
    last = bare.rsplit(":", 1)[-1]
    return int(last) if last.isdigit() else 0


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
    (``4`` or ``h100:4``) or a per-node TRES (``gres/gpu:4``, ``gres/gpu:h100:4``)."""
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
            raise PlanError(f"--allocation {text!r}: {part!r} is not NODE:GPUS")
        nodes[name] = int(gpus or 0)
    if not nodes:
        raise PlanError(f"--allocation {text!r}: no node")
    return nodes


def expand_nodes(nodelist: str) -> list[str]:
    """``node[01-03],gpu7`` as Slurm expands it (``scontrol show hostnames``)."""
    if not nodelist:
        return []
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
        # without scontrol only a list with no ranges is read: ``a,b`` but never ``n[1-3]``
        names = [] if any(c in nodelist for c in "[]") else [n for n in nodelist.split(",") if n]
    if not names:
        raise PlanError(f"cannot expand the node list {nodelist!r} (scontrol)")
    return names


# ---- ports -------------------------------------------------------------------------------------


def first_block_start(job: str, base: int | None = None) -> int:
    """Where the job's block of ports starts: ``GC_RAY_PORT_BASE``, else the job id's block
    among the 56 between PORT_FLOOR and PORT_CEILING. Jobs whose ids differ by less than 56
    (neighbours, the tasks of one array: each has its own id) never share one."""
    if base is not None:
        return base
    digits = re.sub(r"\D", "", job) or "0"
    return PORT_FLOOR + int(digits) % BLOCKS * PORT_BLOCK


def other_block(start: int) -> int:
    """The block a clash moves the job to: half the ring away, past the neighbouring jobs'."""
    index = (start - PORT_FLOOR) // PORT_BLOCK
    return PORT_FLOOR + (index + BLOCKS // 2) % BLOCKS * PORT_BLOCK


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
    found["judge-port"] = start + 19  # the judge's Serve proxy
    return found | {"min-worker-port": start + 20, "max-worker-port": start + PORT_BLOCK - 1}


# ---- the plan ----------------------------------------------------------------------------------


@dataclass
class NodePlan:
    name: str
    gpus: int
    nli_replicas: int = 0
    nli_gpus: float = 0.0
    judge_replicas: int = 0
    drivers: int = 0
    idle_gpus: int = 0
    idle_why: str = ""


@dataclass
class Plan:
    """What the job will do, worked out before anything starts."""

    job: str
    nodes: list[NodePlan]
    ports: dict[str, int]
    judge: str | None = None
    served_name: str | None = None
    tensor_parallel: int | None = None
    tensor_parallel_from: str | None = None
    max_model_len: int | None = None
    size: ModelSize | None = None
    size_from: str | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_from: str | None = None
    gpu_memory_per_node: dict[str, float] = field(default_factory=dict)
    tensor_parallel_why: str | None = None  # where the NLI app's share raised the parallelism
    utilisation: float = UTILISATION
    replicas: int = 0
    judge_device: str | None = None
    judge_start_timeout: float = JUDGE_START_TIMEOUT
    loras: dict[str, str] = field(default_factory=dict)
    engine_args: list[str] = field(default_factory=list)
    nli: str | None = None
    nli_app: str = NLI_APP
    nli_device: str | None = None
    nli_gpu_fraction: float | None = None
    nli_start_timeout: float = NLI_START_TIMEOUT
    max_requeues: int = MAX_REQUEUES
    restarts: int = 0
    requeue: bool = True
    dashboard: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    command_dry_run: str | None = None  # passed | waits for its inputs | none (no --dry-run)

    @property
    def drivers(self) -> int:
        return sum(n.drivers for n in self.nodes)

    @property
    def nli_replicas(self) -> int:
        return sum(n.nli_replicas for n in self.nodes)

    def nli_nodes(self) -> list[str]:
        return [n.name for n in self.nodes if n.nli_replicas]

    @property
    def sharing(self) -> bool:
        """The NLI app shares a judge's GPU (``--nli-gpu-fraction``)."""
        return bool(self.nli_gpu_fraction and self.nli_device == "cuda" and self.judge)

    def judge_gpu_share(self) -> float:
        """Of each GPU a judge's replica uses: all, or what the NLI app's share leaves."""
        return round(1 - (self.nli_gpu_fraction or 0), 4) if self.sharing else 1.0

    def nli_resources(self, resource: str) -> dict[str, float]:
        """What each NLI replica asks Ray for: the resource only its nodes offer, and a share of
        a GPU where it shares one (a whole GPU otherwise: ``--nli-device cuda``)."""
        own: dict[str, float] = {resource: 1}
        if self.sharing:
            own["GPU"] = self.nli_gpu_fraction or 0.0
        return own

    def bundles(self) -> list[dict[str, float]]:
        """Each judge replica's placement bundles, as serving.cluster.serve_app makes them."""
        if not self.judge:
            return []
        if self.judge_device == "cpu":
            return [{"CPU": 1}]
        return [{"GPU": self.judge_gpu_share(), "CPU": 1}] * (self.tensor_parallel or 1)

    def as_json(self) -> dict[str, Any]:
        """The plan as one object (``cluster plan --json``; ``cluster-logs/plan.json``)."""
        return {
            "job": self.job,
            "nodes": [asdict(n) for n in self.nodes],
            "gpus_per_node": {n.name: n.gpus for n in self.nodes},
            "gpu_memory_gib": self.gpu_memory_gib,
            "gpu_memory_from": self.gpu_memory_from,
            "gpu_memory_gib_per_node": self.gpu_memory_per_node,
            "judge": self.judge,
            "served_name": self.served_name,
            "tensor_parallel": self.tensor_parallel,
            "tensor_parallel_from": self.tensor_parallel_from,
            "tensor_parallel_why": self.tensor_parallel_why,
            "max_model_len": self.max_model_len,
            "judge_memory_gib": round(self.size.needed / GIB, 1) if self.size else None,
            "judge_size_from": self.size_from,
            "gpu_memory_utilization": self.utilisation,
            "replicas": self.replicas,
            "replicas_per_node": {n.name: n.judge_replicas for n in self.nodes},
            "bundles_per_replica": self.bundles(),
            "placement_strategy": "STRICT_PACK" if self.judge else None,
            "judge_device": self.judge_device,
            "judge_start_timeout": self.judge_start_timeout,
            "loras": self.loras,
            "nli": self.nli,
            "nli_app": self.nli_app if self.nli else None,
            "nli_device": self.nli_device,
            "nli_gpu_fraction": self.nli_gpu_fraction if self.sharing else None,
            "nli_replicas": self.nli_replicas,
            "nli_replicas_per_node": {n.name: n.nli_replicas for n in self.nodes},
            "idle_gpus_per_node": {n.name: n.idle_gpus for n in self.nodes},
            "idle_why": {n.name: n.idle_why for n in self.nodes if n.idle_gpus},
            "drivers": self.drivers,
            "drivers_per_node": {n.name: n.drivers for n in self.nodes},
            "ports": self.ports,
            "port_block": [self.ports["port"], self.ports["max-worker-port"]],
            "max_requeues": self.max_requeues if self.requeue else 0,
            "restarts": self.restarts,
            "dashboard": self.dashboard,
            "inputs": self.inputs,
            "command": self.command,
            "command_dry_run": self.command_dry_run,
        }

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
            if self.size is not None and self.gpu_memory_gib:
                share = f", {self.judge_gpu_share():g} of each GPU" if self.sharing else ""
                out.append(
                    f"plan: the judge needs {self.size.text()} (config: {self.size_from}); GPUs "
                    f"of {self.gpu_memory_gib:g} GiB ({self.gpu_memory_from}), vLLM using "
                    f"{self.utilisation:g}{share}"
                )
            if self.tensor_parallel_why:
                out.append(f"plan: {self.tensor_parallel_why}")
            out.append(f"plan: the judge's start waits up to {self.judge_start_timeout:.0f} s")
            if self.loras:
                out.append(f"plan: adapters {', '.join(self.loras)} on every judge replica")
        if self.nli:
            where = ", ".join(f"{n.name} {n.nli_replicas}" for n in self.nodes)
            how = (
                f", {self.nli_gpu_fraction:g} of a GPU each beside a judge"
                if self.sharing
                else (", a GPU each" if self.nli_device == "cuda" else "")
            )
            out.append(f"plan: NLI app {self.nli} on {self.nli_device}{how}, per node: {where}")
        for node in self.nodes:
            if node.idle_gpus:
                out.append(f"plan: {node.idle_gpus} GPU(s) idle on {node.name}: {node.idle_why}")
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


def plan_for(
    ask: PlanAsk,
    job: str,
    node_gpus: dict[str, int],
    restarts: int = 0,
    gpu_memory: tuple[float, str] | None = None,
    gpu_memory_per_node: dict[str, float] | None = None,
) -> Plan:
    """The plan for this allocation (``gpu_memory``: the GiB of the GPUs a replica is sized
    for and where that was read; ``gpu_memory_per_node``: each node's, as read there), or
    ``PlanError`` for one that cannot run."""
    nodes = [NodePlan(name, gpus, drivers=ask.drivers_per_node) for name, gpus in node_gpus.items()]
    if ask.drivers_per_node < 1:
        raise PlanError("--drivers-per-node must be at least 1")
    on_gpu = any(n.gpus for n in nodes)
    plan = Plan(
        job=job,
        nodes=nodes,
        ports=block_ports(first_block_start(job, ask.port_base)),
        max_requeues=ask.max_requeues,
        restarts=restarts,
        requeue=ask.requeue,
        dashboard=ask.dashboard,
        nli_app=ask.nli_app,
        nli_start_timeout=ask.nli_start_timeout,
    )
    if on_gpu:
        memory = gpu_memory or (
            (ask.gpu_memory_gib, "--gpu-memory")
            if ask.gpu_memory_gib
            else (DEFAULT_GPU_GIB, "assumed: give --gpu-memory GB")
        )
        plan.gpu_memory_gib, plan.gpu_memory_from = memory
        plan.gpu_memory_per_node = dict(gpu_memory_per_node or {})
    if ask.nli:
        place_nli(plan, ask, on_gpu)
    if ask.judge:
        place_judge(plan, ask.judge, on_gpu)
    elif ask.nli_gpu_fraction:
        raise PlanError("--nli-gpu-fraction shares a judge's GPU: give --judge")
    for node in plan.nodes:
        explain_idle(plan, node)
    return plan


def place_nli(plan: Plan, ask: PlanAsk, on_gpu: bool) -> None:
    """One NLI replica per node (on CUDA: a GPU of that node, or a share of a judge's), on the
    first N nodes; on a CPU-only allocation one replica."""
    assert ask.nli
    plan.nli, plan.nli_device = ask.nli, "cuda" if on_gpu else "cpu"
    fraction = ask.nli_gpu_fraction
    if fraction is not None and not 0 < fraction < 1:
        raise PlanError(f"--nli-gpu-fraction {fraction:g}: a share of one GPU, between 0 and 1")
    plan.nli_gpu_fraction = fraction
    count = (
        (len(plan.nodes) if on_gpu else 1) if ask.nli_replicas == "auto" else int(ask.nli_replicas)
    )
    if count < 1:
        raise PlanError("--nli-replicas must be at least 1 (or leave --nli out)")
    if count > len(plan.nodes):
        raise PlanError(
            f"--nli-replicas {count}: one NLI replica per node, and the job has "
            f"{len(plan.nodes)} node(s)"
        )
    for node in plan.nodes[:count]:
        node.nli_replicas = 1
        if on_gpu and node.gpus < 1:
            raise PlanError(f"node {node.name} has no GPU for its NLI replica")
        node.nli_gpus = (fraction or 1.0) if on_gpu else 0.0


def served_name(model: str) -> str:
    """The name the judge is served under: a preset's, else its folder's or hub id's."""
    try:
        preset = resolve(model)
    except UnknownModelError as exc:
        raise PlanError(str(exc)) from None
    return preset.name if PRESETS.get(preset.name) is preset else (Path(model).name or model)


def judge_size(ask: JudgeAsk) -> tuple[str, int | None, ModelSize | None, str | None]:
    """(served name, a preset's parallelism, the model's size from its config, where the config
    was read): a preset, a hub id or a local folder alike."""
    try:
        preset = resolve(ask.model)
    except UnknownModelError as exc:
        raise PlanError(str(exc)) from None
    known = PRESETS.get(preset.name) is preset  # a folder named like one is itself
    served = preset.name if known else (Path(ask.model).name or ask.model)
    length = ask.max_model_len or (preset.max_model_len if known else None)
    source = ask.model if not known else model_source(preset)
    try:
        found = read_config(ask.model, source)
        size = size_of(found[0], served, length) if found else None
    except SizingError as exc:
        raise PlanError(str(exc)) from None
    return served, preset.tensor_parallel_size if known else None, size, found and found[1]


def place_judge(plan: Plan, ask: JudgeAsk, on_gpu: bool) -> None:
    served, preset_tp, size, size_from = judge_size(ask)
    plan.judge, plan.served_name = ask.model, served
    plan.loras, plan.engine_args = dict(ask.loras), list(ask.engine_args)
    plan.judge_start_timeout = ask.start_timeout
    plan.size, plan.size_from = size, size_from
    plan.max_model_len = size.max_model_len if size else ask.max_model_len
    if not on_gpu:  # vLLM's CPU engine: one replica where asked, on the first nodes
        plan.judge_device, plan.tensor_parallel, plan.tensor_parallel_from = "cpu", 1, "CPU"
        if ask.replicas == "auto":
            raise PlanError(
                "--replicas auto counts GPUs and the allocation has none: give --replicas N for "
                "CPU replicas, or ask for GPUs (--gpus-per-node)"
            )
        plan.replicas = int(ask.replicas)
        for k in range(plan.replicas):
            plan.nodes[k % len(plan.nodes)].judge_replicas += 1
        return
    plan.judge_device = "cuda"
    if plan.sharing:  # vLLM may use less of each GPU: an NLI replica may share it
        plan.utilisation = round(UTILISATION - (plan.nli_gpu_fraction or 0), 4)
    gpu_bytes = (plan.gpu_memory_gib or DEFAULT_GPU_GIB) * GIB
    most = max(n.gpus for n in plan.nodes)
    if ask.gpus_per_replica:
        plan.tensor_parallel, plan.tensor_parallel_from = ask.gpus_per_replica, "--gpus-per-replica"
    elif size is not None:
        fitting = size.smallest_parallelism(gpu_bytes, plan.utilisation, most)
        if fitting is None:
            raise PlanError(
                f"{served} fits no node: one replica needs {size.text()}, and a node has at "
                f"most {most} GPU(s) of {plan.gpu_memory_gib:g} GiB ({plan.gpu_memory_from}; "
                f"vLLM uses {plan.utilisation:g} of each, its runtime 3.5-5 GiB of that; the "
                "parallelism must divide its "
                f"{size.heads} heads): ask for nodes with more or larger GPUs, or a shorter "
                "--max-model-len"
            )
        plan.tensor_parallel, plan.tensor_parallel_from = fitting, "memory"
    elif preset_tp is not None:
        plan.tensor_parallel = preset_tp
        plan.tensor_parallel_from = "preset: no config.json to size it from (prefetch it)"
    else:
        raise PlanError(
            f"{ask.model}: no config.json found to size it from (a folder holds one; a hub id's "
            "is fetched by `groundcover cluster prefetch`): fetch it, or give --gpus-per-replica"
        )
    tp = plan.tensor_parallel
    free = {n.name: n.gpus - (0 if plan.sharing else int(n.nli_gpus)) for n in plan.nodes}
    fits = {name: max(gpus, 0) // tp for name, gpus in free.items()}
    if not any(fits.values()):
        best = max(plan.nodes, key=lambda n: free[n.name])
        beside = ""
        if best.nli_gpus and not plan.sharing:
            beside = f" ({int(best.nli_gpus)} of its {best.gpus} for the NLI app)"
        raise PlanError(
            f"{served} needs {tp} GPUs on one node (tensor parallelism {tp}, "
            f"{plan.tensor_parallel_from}) and no node has that many free: the most is "
            f"{free[best.name]} on {best.name}{beside}; ask for nodes with {tp}+ GPUs, fewer "
            "NLI replicas, --nli-gpu-fraction, or another --gpus-per-replica"
        )
    room = sum(fits.values())
    count = room if ask.replicas == "auto" else int(ask.replicas)
    if count < 1 or count > room:
        per = ", ".join(f"{name} {n}" for name, n in fits.items())
        raise PlanError(
            f"--replicas {count}: {room} replica(s) of {tp} GPU(s) fit this allocation "
            f"(per node: {per}); a replica that fits nowhere would wait forever"
        )
    left = count
    for node in plan.nodes:  # in node order: Ray places them where they fit, as many per node
        node.judge_replicas = min(fits[node.name], left)
        left -= node.judge_replicas
    plan.replicas = count
    if size is not None and plan.sharing and plan.tensor_parallel_from == "memory":
        plan.tensor_parallel_why = share_cost(plan, size, gpu_bytes, most)


def share_cost(plan: Plan, size: ModelSize, gpu_bytes: float, most: int) -> str | None:
    """Where the NLI app's share of a GPU leaves vLLM too little of it for the parallelism the
    judge needs on whole GPUs: one line saying so, and what the plan would be without it."""
    fitting = plan.tensor_parallel or 1
    whole = size.smallest_parallelism(gpu_bytes, UTILISATION, most)
    if whole is None or whole >= fitting:
        return None
    beside = sum(max(n.gpus - int(n.nli_replicas), 0) // whole for n in plan.nodes)
    fraction = plan.nli_gpu_fraction or 0
    return (
        f"--nli-gpu-fraction {fraction:g} leaves vLLM {plan.utilisation:g} of each GPU, too "
        f"little for a replica on {whole} GPU(s) ({size.needed / GIB:.1f} GiB): tensor "
        f"parallelism {fitting}, {plan.replicas} replica(s); without the share (the NLI app on "
        f"a GPU of its own) {whole}, {beside} replica(s)"
    )


def explain_idle(plan: Plan, node: NodePlan) -> None:
    """The GPUs of ``node`` nothing uses, and why (with what would use them)."""
    if not node.gpus:
        return
    whole_nli = 0 if plan.sharing else int(node.nli_gpus)
    used = whole_nli
    if plan.judge_device == "cuda":
        used += node.judge_replicas * (plan.tensor_parallel or 1)
    node.idle_gpus = max(node.gpus - used, 0)
    if not node.idle_gpus:
        return
    if not plan.judge or plan.judge_device != "cuda":
        node.idle_why = "no judge is served (--judge)" if not plan.judge else "the judge is on CPU"
        return
    tp = plan.tensor_parallel or 1
    left = node.gpus - whole_nli
    if node.judge_replicas < left // tp:
        node.idle_why = f"--replicas {plan.replicas} asks fewer than fit"
        return
    why = f"a replica needs {tp} GPU(s) (tensor parallelism {tp}) and {left % tp} are left"
    if whole_nli and plan.size is not None and plan.gpu_memory_gib:
        shared = UTILISATION - SHARE_HINT
        if plan.size.fits(tp, plan.gpu_memory_gib * GIB, shared) and node.gpus // tp > left // tp:
            why += (
                f" beside the NLI app's GPU; --nli-gpu-fraction {SHARE_HINT:g} puts the NLI "
                f"app beside a judge and fits {node.gpus // tp} replica(s) here"
            )
    node.idle_why = why


def gpu_mib_here() -> list[float]:
    """Each GPU's memory on this node in MiB (``nvidia-smi``); none on a CPU node."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return mib_readings(done.stdout.split()) if done.returncode == 0 else []


def mib_readings(words: list[str]) -> list[float]:
    """The GPU sizes among ``nvidia-smi``'s words, in MiB: a reading it could not make
    (``[N/A]``) or of nothing (0) is no reading."""
    return [float(v) for v in words if v.replace(".", "", 1).isdigit() and float(v) > 0]


def gpu_memory_here() -> tuple[float, str] | None:
    """The smallest GPU's memory on this node (``nvidia-smi``), in GiB."""
    sizes = gpu_mib_here()
    return (min(sizes) / 1024, "nvidia-smi on the head") if sizes else None


def smallest_gpu_memory(
    reported: dict[str, list[float]], node_gpus: dict[str, int]
) -> tuple[float, str, dict[str, float]] | None:
    """The GiB every judge replica is sized for, where it was read, and each node's smallest
    GPU: each node's own ``nvidia-smi`` (``reported``, MiB), the smallest over the nodes with
    GPUs, so a replica fits wherever Ray places it (an 80 GB and a 40 GB node: 40). Where the
    nodes differ the node that decided it is named; a node with GPUs and no reading too."""
    per_node = {
        name: round(min(reported[name]) / 1024, 1)
        for name in node_gpus
        if node_gpus[name] and reported.get(name)
    }
    if not per_node:
        return None
    smallest = min(per_node, key=lambda name: per_node[name])
    unread = [name for name, gpus in node_gpus.items() if gpus and name not in per_node]
    if len(set(per_node.values())) == 1:
        where = f"nvidia-smi on each of {len(per_node)} node(s)"
    else:
        others = ", ".join(f"{n} {g:g}" for n, g in per_node.items() if n != smallest)
        where = f"nvidia-smi on each node, the smallest: {smallest}'s; {others} GiB"
    if unread:
        where += f"; not read on {', '.join(unread)}"
    return per_node[smallest], where, per_node
